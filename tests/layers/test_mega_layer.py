"""The MEGA layer: shapes, chunked = full when one chunk holds the sequence, its gates and EMA, CSP in place of the
attention, parameter counts of MEGA's modules, and clear errors (the contract tests cover the rest)."""

import math

import pytest
import torch

from attnzoo.layers import build_attention
from attnzoo.layers._norms import NORM_LAYERS
from attnzoo.ops import mega as mega_ops
from attnzoo.ops.ema import ema

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors on a shared 2-core machine

D = 8


def _layer(**opts):
    torch.manual_seed(0)
    m = build_attention("mega", D, 1, **opts).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def _x(n, seed=1):
    return torch.randn(2, n, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "opts",
    [{}, {"attention": "laplace", "chunk_size": 4}, {"attention": "csp", "csp_groups": 5}, {"norm_layer": "batchnorm"}],
)
@pytest.mark.parametrize("n", [1, 10])
def test_shapes(opts, n):
    if opts.get("csp_groups", 1) > n:
        opts = {**opts, "csp_groups": None}
    y = _layer(**opts, max_len=16)(_x(n))
    assert y.shape == (2, n, D) and torch.isfinite(y).all()


@pytest.mark.parametrize("attention", ["softmax", "laplace"])
@pytest.mark.parametrize("n", [5, 8])
def test_one_chunk_holding_the_sequence_is_full_attention(attention, n):
    full = _layer(attention=attention, max_len=8)
    chunked = _layer(attention=attention, chunk_size=8)  # same parameter shapes: 2 * 8 - 1 bias entries
    chunked.load_state_dict(full.state_dict())
    x = _x(n)
    torch.testing.assert_close(chunked(x), full(x), rtol=0, atol=1e-13)
    # and smaller chunks are a different map
    small = _layer(attention=attention, chunk_size=2, max_len=8)
    sd = {k: v for k, v in full.state_dict().items() if k != "rel_bias"}
    small.load_state_dict({**sd, "rel_bias": full.rel_bias.detach()[6:9]}, strict=True)
    assert not torch.allclose(small(x), full(x))


def test_layer_is_mega_equations_written_out():
    # MEGA §3.1-3.2 with the layer's own parameters, from the public ops only (prenorm, softmax, no chunks)
    m = _layer(max_len=12)
    x = _x(7)
    xn = m.norm(x)
    a, d, b, e = m.ema_coefficients()
    mx = torch.nn.functional.silu(ema(xn, a, d, b, e, causal=False, backend="naive") + xn * m.ema_omega)
    u, z, r, hx = torch.split(m.mx_proj(mx), [D, m.zdim, m.hdim, D], dim=-1)
    u, z, r = torch.sigmoid(u), torch.nn.functional.silu(z), torch.nn.functional.silu(r)
    q, k = z * m.qk_scale[0] + m.qk_offset[0], z * m.qk_scale[1] + m.qk_offset[1]
    v = torch.nn.functional.silu(m.v_proj(xn))
    i = torch.arange(7)
    bias = m.rel_bias[11 + i[None, :] - i[:, None]]
    o = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(m.zdim) + bias, -1) @ v
    h = torch.nn.functional.silu(hx + m.h_proj(o * r))
    torch.testing.assert_close(m(x), u * h + (1 - u) * x, rtol=1e-12, atol=1e-12)


def test_csp_variant_permutes_the_value():
    m = _layer(attention="csp", csp_groups=None, shift_schedule="linear")  # shifting only (CSP Table 7, Image)
    assert not hasattr(m, "rel_bias") and not hasattr(m, "qk_scale")
    x = _x(6).requires_grad_()
    m(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())
    assert m.shifts_for(6).tolist() == [(c * 1) % 6 for c in range(m.hdim)]  # ceil(6 / 16) = 1: one step per channel


def _mega_count(D, Z, E, h, R, norm="layernorm", csp=False):
    # the module shapes of MEGA's MovingAverageGatedAttention (facebookresearch/mega), written out
    norm_p = 1 if norm == "scalenorm" else 2 * D
    ema_p = 4 * (2 * D * h) + D  # delta, alpha, beta (2D, h, 1); gamma (2D, h); omega (D)
    z = 0 if csp else Z
    proj = (D * E + E) + (D * (z + E + 2 * D) + z + E + 2 * D) + (E * D + D)
    extra = 0 if csp else 4 * Z + 2 * R - 1
    return norm_p + ema_p + proj + extra


@pytest.mark.parametrize(
    "opts,expect",
    [
        (dict(zdim=64, hdim=160, ndim=16, max_len=2002), dict(Z=64, E=160, h=16, R=2002)),
        (dict(zdim=64, hdim=256, ndim=16, chunk_size=128, norm_layer="scalenorm"), dict(Z=64, E=256, h=16, R=128)),
        (dict(attention="csp", hdim=320, ndim=16), dict(Z=64, E=320, h=16, R=0, csp=True)),
    ],
)
def test_parameter_count_follows_mega_modules(opts, expect):
    dim = 80
    m = build_attention("mega", dim, 1, **opts)
    norm = opts.get("norm_layer", "layernorm")
    assert sum(p.numel() for p in m.parameters()) == _mega_count(dim, norm=norm, **expect)


def test_norm_names_agree_between_ops_and_layers():
    assert tuple(NORM_LAYERS) == tuple(mega_ops.NORM_LAYERS)


def test_bad_options_and_lengths_fail_clearly():
    with pytest.raises(
        ValueError, match=r"attention='relu2' is not supported; valid choices: \['softmax', 'laplace', 'csp'\]"
    ):
        build_attention("mega", D, 1, attention="relu2")
    with pytest.raises(ValueError, match="chunk_size=4 chunks MEGA's attention; with attention='csp'"):
        build_attention("mega", D, 1, attention="csp", chunk_size=4)
    with pytest.raises(ValueError, match=r"norm_layer='rmsnorm' is not supported"):
        build_attention("mega", D, 1, norm_layer="rmsnorm")
    with pytest.raises(ValueError, match="zdim must be a positive integer, got 0"):
        build_attention("mega", D, 1, zdim=0)
    with pytest.raises(ValueError, match=r"layer_index must be an integer in \[0, num_layers=2\), got 2"):
        build_attention("mega", D, 1, layer_index=2, num_layers=2)
    with pytest.raises(ValueError, match=r"attention='csp' has no causal form.*use attention='softmax' or 'laplace'"):
        build_attention("mega", D, 1, causal=True, attention="csp")
    with pytest.raises(ValueError, match=r"norm_layer='batchnorm' has no causal form.*'layernorm' or 'scalenorm'"):
        build_attention("mega", D, 1, causal=True, norm_layer="batchnorm")
    with pytest.raises(ValueError, match=r"MegaLayer\(max_len=6\) got N=7 tokens"):
        _layer(max_len=6)(_x(7))
    with pytest.raises(
        ValueError, match=r"csp_groups=4\) needs N divisible by csp_groups, got N=6; valid csp_groups: \[1, 2, 3, 6\]"
    ):
        _layer(attention="csp", csp_groups=4)(_x(6))
    bad = _x(5)
    bad[0, 2, 3] = float("inf")
    with pytest.raises(ValueError, match="x contains non-finite"):
        _layer(max_len=8)(bad)
