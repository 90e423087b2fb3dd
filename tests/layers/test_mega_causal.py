"""The causal MEGA layer (MEGA's decoders): the decoding cache, prefill, padded rows, and what has no causal form
(CSP, BatchNorm). No future token read, decoding equal to the forward and masks: tests/contract."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from attnzoo.layers import build_attention

sys.path.insert(0, str(Path(__file__).parents[1] / "ops"))
from varlen_cases import assert_equal_to_alone  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors on a shared 2-core machine

D, N = 8, 11
VARIANTS = [
    {"attention": "softmax"},
    {"attention": "laplace"},
    {"attention": "softmax", "chunk_size": 4},
    {"attention": "laplace", "chunk_size": 3},
    {"attention": "softmax", "chunk_size": 1},
    {"attention": "laplace", "chunk_size": 4, "prenorm": False, "norm_layer": "scalenorm"},
]


def _layer(dtype=torch.float64, **opts):
    torch.manual_seed(0)
    opts = {"ndim": 3, "zdim": 5, "hdim": 6, "max_len": 16, **opts}
    m = build_attention("mega", D, 1, causal=True, **opts).to(dtype).eval()
    with torch.no_grad():  # away from the init (zero offsets, small weights), which can hide a wrong term
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return m


def _x(n=N, b=2, dtype=torch.float64, seed=1):
    return torch.randn(b, n, D, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _decode(m, x, state=None):
    state = m.init_state(x.shape[0]) if state is None else state
    outs = []
    for t in range(x.shape[1]):
        y, state = m.step(x[:, t : t + 1], state)
        outs.append(y)
    return torch.cat(outs, 1), state


@pytest.mark.parametrize("opts", VARIANTS)
def test_decoding_cache_holds_the_current_chunk_only(opts):
    # decoding equals the causal forward: tests/contract; here what the cache holds after N tokens
    m = _layer(**opts)
    _, state = _decode(m, _x())
    r = opts.get("chunk_size")
    # MEGA-chunk's cache holds the current chunk only; without chunks it holds every token
    assert state["k"].shape[1] == (N % r if r else N)
    assert state["pos"].tolist() == [N, N]


@pytest.mark.parametrize("opts", [VARIANTS[1], VARIANTS[2], VARIANTS[4]])
@pytest.mark.parametrize("t", [1, 4, 7])
def test_prefill_holds_the_state_of_stepping_the_prompt(opts, t):
    # t = 4 ends a chunk of 4 (an empty cache), 7 leaves 3 keys; decoding on from either state gives the forward
    m = _layer(**opts)
    x = _x()
    out, state = m.prefill(x[:, :t])
    stepped, ref = _decode(m, x[:, :t])
    torch.testing.assert_close(out, m(x[:, :t]), rtol=0, atol=0)
    torch.testing.assert_close(out, stepped, rtol=1e-12, atol=1e-12)
    assert state.keys() == ref.keys()
    for name in state:
        assert state[name].shape == ref[name].shape and state[name].dtype == ref[name].dtype, name
        torch.testing.assert_close(state[name], ref[name], rtol=1e-12, atol=1e-12)
    rest, _ = _decode(m, x[:, t:], state)
    torch.testing.assert_close(rest, m(x)[:, t:], rtol=1e-12, atol=1e-12)


def test_prefill_of_a_padded_prompt_replays_it():
    m = _layer()
    x = _x(5)
    assert m.prefill(x, attention_mask=torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])) is None
    assert m.prefill(x, attention_mask=torch.ones(2, 5)) is not None  # nothing padded
    with pytest.raises(ValueError, match="prefill decodes causally; build the module with causal=True"):
        build_attention("mega", D, 1).prefill(x)


def test_decoding_in_float32():
    m = _layer(torch.float32, attention="laplace", chunk_size=4)
    x = _x(dtype=torch.float32)
    torch.testing.assert_close(_decode(m, x)[0], m(x), rtol=1e-5, atol=1e-5)


def test_causal_differs_from_bidirectional_and_has_one_ema_direction():
    causal = _layer()
    torch.manual_seed(0)
    bi = build_attention("mega", D, 1, ndim=3, zdim=5, hdim=6, max_len=16).double().eval()
    assert causal.ema_alpha.shape == (1, D, 3) and bi.ema_alpha.shape == (2, D, 3)
    # MEGA's unidirectional EMA: 4 D h + D parameters (delta, alpha, beta, gamma of D x h, omega of D)
    n_causal = sum(p.numel() for p in causal.parameters())
    assert sum(p.numel() for p in bi.parameters()) - n_causal == 4 * D * 3
    with torch.no_grad():
        sd = {k: (v[:1] if k.startswith("ema_") and k != "ema_omega" else v) for k, v in bi.state_dict().items()}
    causal.load_state_dict(sd)
    x = _x()
    assert not torch.allclose(causal(x), bi(x))


@pytest.mark.parametrize("opts", [VARIANTS[0], VARIANTS[3]])
def test_padded_rows_decode_each_alone(opts):
    # left padding of 3 tokens in row 0: its state and position wait, its outputs are zero
    m = _layer(**opts)
    x = _x(8)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False
    state, outs = m.init_state(2), []
    for t in range(8):
        y, state = m.step(x[:, t : t + 1], state, attention_mask=mask[:, : t + 1])
        outs.append(y)
    out = torch.cat(outs, 1)
    assert bool((out[0, :3] == 0).all())
    torch.testing.assert_close(out[0, 3:], m(x[:1, 3:])[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[1], m(x[1:])[0], rtol=1e-12, atol=1e-12)
    assert state["pos"].tolist() == [5, 8]


def test_decoding_errors_are_clear():
    m = _layer(max_len=4)
    x = _x(5)
    state = m.init_state(2)
    for t in range(4):
        _, state = m.step(x[:, t : t + 1], state)
    with pytest.raises(ValueError, match=r"MegaLayer\(max_len=4\) cannot decode token 5.*set chunk_size"):
        m.step(x[:, 4:5], state)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 1, dim\)"):
        m.step(x[:, :2], m.init_state(2))
    with pytest.raises(TypeError, match=r"state must be the dict returned by init_state/step"):
        m.step(x[:, :1], {"k": torch.zeros(2, 0, 5)})
    with pytest.raises(ValueError, match="state was built for batch size 3"):
        m.step(x[:, :1], m.init_state(3))
    with pytest.raises(ValueError, match=r"attention_mask must hold only 0/1"):
        m.step(x[:, :1], m.init_state(2), attention_mask=torch.tensor([[2], [1]]))
    bidirectional = build_attention("mega", D, 1)
    with pytest.raises(ValueError, match="build the module with causal=True"):
        bidirectional.step(torch.zeros(1, 1, D), None)


def test_no_causal_form_with_csp_or_batchnorm():
    with pytest.raises(ValueError, match=r"^attention 'mega': MEGA with attention='csp' has no causal form.*"):
        build_attention("mega", D, 1, causal=True, attention="csp", csp_groups=None)
    with pytest.raises(ValueError, match=r"norm_layer='batchnorm' has no causal form.*'layernorm' or 'scalenorm'"):
        build_attention("mega", D, 1, causal=True, norm_layer="batchnorm")
    # both build bidirectionally
    build_attention("mega", D, 1, attention="csp", csp_groups=None)
    build_attention("mega", D, 1, norm_layer="batchnorm")


def test_batchnorm_refuses_masks_in_training_and_honours_them_in_eval():
    # in training BatchNorm's statistics pool the padding and every sequence of the row; its running statistics
    # (eval) act per token, so each sequence then equals itself alone
    torch.manual_seed(0)
    m = build_attention("mega", D, 1, norm_layer="batchnorm", ndim=3, zdim=5, hdim=6, max_len=8).double()
    x, mask = _x(6), torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"norm_layer='batchnorm'.*padding included; use 'layernorm' or 'scalenorm'"):
        m.train()(x, attention_mask=mask)
    with pytest.raises(ValueError, match=r"norm_layer='batchnorm'"):
        m.train()(x.reshape(1, 12, D), cu_seqlens=torch.tensor([0, 5, 12], dtype=torch.int32))
    m.eval()
    seqs = [{"x": x[:1, :4]}, {"x": x[1:]}]
    assert_equal_to_alone(m, seqs, {"x": 1}, mode="left", out_axis=1)
