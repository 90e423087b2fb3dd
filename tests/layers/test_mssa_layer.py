"""MSSAAttention module: CRATE layout, AoT variants (causal, normalised query, tied lift), KV cache, compile."""

import pytest
import torch
import torch.nn.functional as F

import attnzoo
from attnzoo.layers import capture_internals

DIM, HEADS = 12, 3
P = DIM // HEADS


def _build(**kw):
    return attnzoo.build_attention("mssa", DIM, HEADS, **kw).double().eval()


def _reference(m, x, causal=False, normalize_query=False, out_proj=True, p=P):
    # Eq. (3)/(5) of AoT per subspace: w_k = U_k^T z, attention over tokens, lift (to_out, or U_k itself).
    b, n, _ = x.shape
    big_u = m.qkv.weight.T  # (dim, K p): columns grouped by head are U_1 ... U_K
    outs = []
    for h in range(HEADS):
        u_k = big_u[:, h * p : (h + 1) * p]
        w = x @ u_k  # (B, N, p)
        q = F.normalize(w, dim=-1) if normalize_query else w
        logits = q @ w.transpose(-1, -2) * p**-0.5
        if causal:
            logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        o = logits.softmax(-1) @ w
        outs.append(o @ u_k.T if not out_proj else o)
    if out_proj:
        return m.to_out(torch.cat(outs, dim=-1))
    return sum(outs)


@pytest.mark.parametrize("n", [1, 2, 7, 16])
@pytest.mark.parametrize(
    "causal,normalize_query,out_proj",
    [(False, False, True), (True, True, True), (True, False, False), (False, True, False)],
)
def test_shape_and_matches_definition(n, causal, normalize_query, out_proj):
    m = _build(causal=causal, normalize_query=normalize_query, out_proj=out_proj)
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    y = m(x)
    assert y.shape == (2, n, DIM)
    torch.testing.assert_close(y, _reference(m, x, causal, normalize_query, out_proj))


@pytest.mark.parametrize("head_dim", [2, 5, 8])
@pytest.mark.parametrize("out_proj", [True, False])
def test_subspace_dim_independent_of_width(head_dim, out_proj):
    """``head_dim`` sets the subspace dimension p (CRATE's dim_head); U is (dim, K p)."""
    m = _build(causal=True, out_proj=out_proj, head_dim=head_dim)
    assert tuple(m.qkv.weight.shape) == (HEADS * head_dim, DIM)
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    torch.testing.assert_close(m(x), _reference(m, x, True, False, out_proj, p=head_dim))
    state = m.init_state(2)
    steps = []
    for t in range(7):
        y, state = m.step(x[:, t : t + 1], state)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), m(x))


def test_parameter_layout_crate_and_tied():
    m = attnzoo.build_attention("mssa", DIM, HEADS)
    shapes = {k: tuple(v.shape) for k, v in m.named_parameters()}
    assert shapes == {"qkv.weight": (DIM, DIM), "to_out.weight": (DIM, DIM), "to_out.bias": (DIM,)}
    tied = attnzoo.build_attention("mssa", DIM, HEADS, out_proj=False)
    assert {k: tuple(v.shape) for k, v in tied.named_parameters()} == {"qkv.weight": (DIM, DIM)}


def test_step_errors():
    m = _build(causal=True)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 1, dim\)"):
        m.step(torch.randn(2, 2, DIM, dtype=torch.float64), m.init_state(2))
    with pytest.raises(TypeError, match=r"keys \['w'\]"):
        m.step(torch.randn(1, 1, DIM, dtype=torch.float64), {"k": None})
    with pytest.raises(ValueError, match="build the module with causal=True"):
        _build().step(torch.randn(1, 1, DIM, dtype=torch.float64), m.init_state(1))


@pytest.mark.parametrize("normalize_query", [False, True])
def test_noncausal_permutation_equivariance(normalize_query):
    m = _build(normalize_query=normalize_query)
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
    else:  # shared Q = K: symmetric logits, so log attn_ij - log attn_ji = a_j - a_i (row log-normalisers)
        d = attn.log() - attn.log().transpose(-1, -2)
        torch.testing.assert_close(d, d[..., :, :1] - d[..., :, :1].transpose(-1, -2))
    torch.testing.assert_close(y, m(x))


def test_build_errors():
    with pytest.raises(ValueError, match="head_dim must be a positive int .* got 0"):
        attnzoo.build_attention("mssa", DIM, HEADS, head_dim=0)
    with pytest.raises(TypeError, match="normalize_query must be a bool"):
        attnzoo.build_attention("mssa", DIM, HEADS, normalize_query=1)
    with pytest.raises(TypeError, match="out_proj must be a bool"):
        attnzoo.build_attention("mssa", DIM, HEADS, out_proj="no")
    with pytest.raises(ValueError, match="scale must be None or a positive finite number"):
        attnzoo.build_attention("mssa", DIM, HEADS, scale=float("nan"))
    assert "mssa" in attnzoo.list_attentions(causal=True)


def test_torch_compile_matches_eager():
    m = attnzoo.build_attention("mssa", DIM, HEADS, causal=True, normalize_query=True).eval()
    x = torch.randn(2, 7, DIM)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("normalize_query", [False, True])
def test_untied_is_softmax_on_three_projections(causal, normalize_query):
    """tied=False (the in-context ablation): softmax(P(q) k^T * scale) v with q, k, v from three projections."""
    torch.manual_seed(0)
    layer = attnzoo.build_attention("mssa", DIM, HEADS, causal=causal, normalize_query=normalize_query, tied=False)
    layer = layer.double()
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    q, k, v = layer.qkv(x).chunk(3, dim=-1)
    q, k, v = (t.unflatten(-1, (HEADS, -1)).transpose(1, 2) for t in (q, k, v))
    if normalize_query:
        q = torch.nn.functional.normalize(q, dim=-1)
    s = q @ k.transpose(-1, -2) * layer.scale
    if causal:
        s = s.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    ref = layer.to_out((s.softmax(-1) @ v).transpose(1, 2).flatten(2))
    torch.testing.assert_close(layer(x), ref)
    assert "tied=False" in repr(layer)


def test_untied_keeps_masks_and_refuses_decoding():
    torch.manual_seed(0)
    layer = attnzoo.build_attention("mssa", DIM, HEADS, causal=True, tied=False).double()
    x = torch.randn(2, 6, DIM, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    out = layer(x, attention_mask=mask)
    torch.testing.assert_close(out[1, 2:], layer(x[1:, 2:])[0])
    assert out[1, :2].abs().max() == 0
    with pytest.raises(ValueError, match="tied=False .* no recurrent state"):
        layer.init_state(2)
    with pytest.raises(ValueError, match="tied=False needs out_proj=True"):
        attnzoo.build_attention("mssa", DIM, HEADS, tied=False, out_proj=False)
