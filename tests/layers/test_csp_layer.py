"""CSPAttention module: parameterisation (CSP Table 3), forward = projections around the op, internals."""

import pytest
import torch

from attnzoo.layers import attention_info, build_attention, capture_internals, list_attentions
from attnzoo.layers.csp import CSPAttention
from attnzoo.ops.csp import csp, csp_shifts


def _n_params(m):
    return sum(p.numel() for p in m.parameters())


def test_registered_and_noncausal_only():
    assert attention_info("csp") is CSPAttention
    assert "csp" in list_attentions(causal=False)
    assert "csp" not in list_attentions(causal=True)
    with pytest.raises(ValueError, match="'csp' has no causal mode"):
        build_attention("csp", 8, 2, causal=True)


@pytest.mark.parametrize("dim", [8, 48])
def test_parameter_count_per_layer(dim):
    # value projection W (no bias) + output projection with bias
    assert _n_params(build_attention("csp", dim, 4)) == 2 * dim * dim + dim
    assert _n_params(build_attention("csp", dim, 4, v_bias=True, proj_bias=False)) == 2 * dim * dim + dim


def test_cifar_vit_counts_of_table3():
    # CIFAR-10 ViT: dim 512, depth 6, MLP 512, 4x4 patches of 32x32x3 images (N = 64 tokens + cls), 10 classes.
    d, depth, mlp, patch_dim, tokens, classes = 512, 6, 512, 48, 65, 10
    rest_per_layer = 2 * d + 2 * d + (d * mlp + mlp) + (mlp * d + d)  # two LayerNorms + MLP
    embed = 2 * patch_dim + patch_dim * d + d + 2 * d + tokens * d + d  # patch LN/linear/LN, pos, cls
    head = 2 * d + d * classes + classes
    mha = 3 * d * d + d * d + d  # bias-free qkv + output projection
    csp_layer = _n_params(build_attention("csp", d, 8))
    vit = lambda attn: embed + depth * (attn + rest_per_layer) + head  # noqa: E731
    assert round(vit(mha) / 1e6, 2) == 9.52
    assert round(vit(csp_layer) / 1e6, 2) == 6.38


@pytest.mark.parametrize("N,groups", [(1, 1), (5, 1), (7, 7), (8, 4), (6, 3), (12, 2)])
def test_forward_is_projections_around_op(N, groups):
    m = build_attention("csp", 12, 3, groups=groups).double()
    x = torch.randn(2, N, 12, dtype=torch.float64)
    v = m.v_proj(x)
    expected = m.proj(csp(v, csp_shifts(N, 12), groups, backend="naive"))
    torch.testing.assert_close(m(x), expected, rtol=1e-12, atol=1e-12)


def test_power_schedule_uses_layer_position():
    m = build_attention("csp", 4, 1, shift_schedule="power", layer_index=1, num_layers=3)
    x = torch.randn(1, 20, 4)
    with capture_internals(m) as store:
        m(x)
    assert torch.equal(store[""]["shifts"], csp_shifts(20, 4, "power", layer=1, num_layers=3))


def test_any_length_with_defaults_and_shift_cache():
    m = build_attention("csp", 8, 2)
    for N in (4, 6, 1, 4, 13):
        assert m(torch.randn(2, N, 8)).shape == (2, N, 8)
        assert torch.equal(m.shifts_for(N), csp_shifts(N, 8))
    assert {k[0] for k in m._shift_cache} == {1, 4, 6, 13}


def test_heads_do_not_change_the_output():
    torch.manual_seed(1)
    a = build_attention("csp", 8, 1, groups=2)
    b = build_attention("csp", 8, 4, groups=2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)


def test_capture_records_shifts_and_permutations():
    m = build_attention("csp", 6, 2, groups=3)
    x = torch.randn(2, 9, 6)
    with capture_internals(m) as store:
        y = m(x)
    rec = store[""]
    assert torch.equal(rec["shifts"], csp_shifts(9, 6))
    perm = rec["perm"]
    assert perm.shape == (2, 6, 9) and perm.dtype == torch.long
    # each row is a permutation of the tokens and reproduces the module's mixing
    assert torch.equal(perm.sort(dim=-1).values, torch.arange(9).expand(2, 6, 9))
    v = rec["v"]
    torch.testing.assert_close(m.proj(v.gather(1, perm.transpose(1, 2))), y, rtol=0, atol=0)


def test_no_permutation_record_for_long_sequences():
    m = build_attention("csp", 2, 1)
    with capture_internals(m) as store:
        m(torch.randn(1, 1025, 2))
    assert "perm" not in store[""] and store[""]["shifts"].shape == (2,)


def test_torch_compile_matches_eager():
    m = build_attention("csp", 8, 2, groups=3)
    x = torch.randn(2, 9, 8)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x), rtol=0, atol=0)


def test_option_errors():
    with pytest.raises(ValueError, match="groups must be a positive integer, got 0"):
        build_attention("csp", 8, 2, groups=0)
    with pytest.raises(ValueError, match=r"shift_schedule='exp'.*\['linear', 'power', 'none'\]"):
        build_attention("csp", 8, 2, shift_schedule="exp")
    with pytest.raises(ValueError, match=r"layer_index must be an integer in \[0, num_layers=2\), got 2"):
        build_attention("csp", 8, 2, layer_index=2, num_layers=2)
    with pytest.raises(ValueError, match=r"proj_dropout must be a probability in \[0, 1\), got 1.5"):
        build_attention("csp", 8, 2, proj_dropout=1.5)
    m = build_attention("csp", 8, 2, groups=4)
    with pytest.raises(ValueError, match=r"groups=4.*N=6.*\[1, 2, 3, 6\]"):
        m(torch.randn(1, 6, 8))
    with pytest.raises(ValueError, match="dim=8"):
        m(torch.randn(1, 8, 5))
