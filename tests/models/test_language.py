"""Causal decoders end to end: no information leaks from the future, incremental decoding equals the full
forward, generation, and clear errors for non-causal mechanisms."""

import pytest
import torch
from models_helpers import tiny_overrides

from attnzoo import list_attentions
from attnzoo.layers.base import attention_info
from attnzoo.models import CausalLM, CausalLMConfig, create_model, get_config, list_models

CAUSAL_MODELS = [n for n in list_models() if get_config(n).arch == "causal_lm"]
ICL_MODELS = [n for n in list_models() if get_config(n).arch == "icl_regressor"]
CAUSAL_MECHS = list_attentions(causal=True)
STEP_MECHS = [m for m in CAUSAL_MECHS if getattr(attention_info(m), "supports_step", False)]


def _tiny_lm(attention: str, **kw) -> CausalLM:
    cfg = CausalLMConfig(vocab_size=37, block_size=12, dim=32, heads=4, depth=2, attention=attention, **kw)
    return CausalLM(cfg).double().eval()


def _assert_no_leak(model, t: int, n: int, vocab: int):
    g = torch.Generator().manual_seed(t)
    idx = torch.randint(0, vocab, (2, n), generator=g)
    ref = model(idx)
    idx2 = idx.clone()
    idx2[:, t + 1 :] = torch.randint(0, vocab, (2, n - t - 1), generator=g)
    assert not torch.equal(idx, idx2)
    out = model(idx2)
    torch.testing.assert_close(out[:, : t + 1], ref[:, : t + 1], rtol=0, atol=1e-12)
    # the perturbation is visible after t (the test can fail)
    assert not torch.allclose(out[:, t + 1 :], ref[:, t + 1 :])


@pytest.mark.parametrize("name", CAUSAL_MODELS)
def test_registered_decoders_do_not_leak(name):
    model = create_model(name, **tiny_overrides(name)).double().eval()
    n = model.config.block_size
    for t in (0, 5, n - 2):
        _assert_no_leak(model, t, n, model.config.vocab_size)


@pytest.mark.parametrize("mech", CAUSAL_MECHS)
def test_every_causal_mechanism_in_a_decoder_does_not_leak(mech):
    model = _tiny_lm(mech)
    for t in (0, 4, 10):
        _assert_no_leak(model, t, 12, 37)


@pytest.mark.parametrize("mech", STEP_MECHS)
@pytest.mark.parametrize("norm,ffn", [("pre", "mlp"), ("post", "mlp"), ("pre", "ista"), ("pre", "none")])
def test_incremental_decoding_equals_full_forward(mech, norm, ffn):
    model = _tiny_lm(mech, norm=norm, ffn=ffn)
    assert model.supports_incremental
    idx = torch.randint(0, 37, (3, 12))
    full = model(idx)
    state = model.init_state(3)
    for t in range(12):
        logits, state = model.step(idx[:, t], state)
        torch.testing.assert_close(logits, full[:, t], rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="past block_size"):
        model.step(idx[:, 0], state)


@pytest.mark.parametrize("name", CAUSAL_MODELS)
def test_registered_decoders_incremental_path(name):
    model = create_model(name, **tiny_overrides(name)).double().eval()
    if not model.supports_incremental:
        with pytest.raises(ValueError, match="incremental decoding needs"):
            model.init_state(1)
        return
    idx = torch.randint(0, model.config.vocab_size, (2, 9))
    full = model(idx)
    state = model.init_state(2)
    steps = []
    for t in range(9):
        logits, state = model.step(idx[:, t], state)
        steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mech", STEP_MECHS)
def test_generate_cached_equals_uncached_greedy(mech):
    model = _tiny_lm(mech)
    prompt = torch.randint(0, 37, (2, 3))
    a = model.generate(prompt, 7, temperature=0, use_cache=True)
    b = model.generate(prompt, 7, temperature=0, use_cache=False)
    assert a.shape == (2, 10)
    assert torch.equal(a[:, :3], prompt)
    assert torch.equal(a, b)


def test_generate_sampling_and_window():
    model = _tiny_lm("softmax")
    prompt = torch.randint(0, 37, (2, 4))
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    a = model.generate(prompt, 5, temperature=0.8, top_k=5, generator=g1)
    b = model.generate(prompt, 5, temperature=0.8, top_k=5, generator=g2, use_cache=False)
    assert torch.equal(a, b)
    # longer than block_size: falls back to the sliding window
    long = model.generate(prompt, 20, temperature=0)
    assert long.shape == (2, 24)
    with pytest.raises(ValueError, match="exceeds block_size"):
        model.generate(prompt, 20, use_cache=True)
    assert torch.equal(model.generate(prompt, 0), prompt)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(prompt, -1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 1, temperature=-1.0)


def test_loss_is_cross_entropy():
    model = _tiny_lm("softmax")
    idx = torch.randint(0, 37, (2, 12))
    tgt = torch.randint(0, 37, (2, 12))
    expected = torch.nn.functional.cross_entropy(model(idx).reshape(-1, 37), tgt.reshape(-1))
    torch.testing.assert_close(model.loss(idx, tgt), expected)
    with pytest.raises(ValueError, match="targets must have the shape"):
        model.loss(idx, tgt[:, :5])


def test_non_causal_attention_in_decoder_is_refused():
    noncausal = [m for m in list_attentions() if m not in CAUSAL_MECHS]
    assert noncausal, "expected at least one bidirectional-only mechanism"
    for mech in noncausal:
        with pytest.raises(ValueError, match="causal mechanisms are") as info:
            create_model("gpt2_base", attention=mech, **tiny_overrides("gpt2_base"))
        for ok in CAUSAL_MECHS:
            assert repr(ok) in str(info.value)
        with pytest.raises(ValueError, match="no causal mode"):
            create_model("icl_gpt", attention=mech, **tiny_overrides("icl_gpt"))


def test_token_id_errors():
    model = _tiny_lm("softmax")
    with pytest.raises(ValueError, match="vocab_size=37"):
        model(torch.tensor([[0, 37]]))
    with pytest.raises(ValueError, match="at most 12"):
        model(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model(torch.zeros(3, dtype=torch.long))


def test_tied_weights_share_storage_and_gradients():
    model = _tiny_lm("softmax")
    assert model.lm_head.weight is model.wte.weight
    untied = _tiny_lm("softmax", tie_weights=False)
    assert untied.lm_head.weight is not untied.wte.weight


@pytest.mark.parametrize("name", ICL_MODELS)
def test_icl_prediction_sees_only_the_prefix(name):
    """Prediction i depends on x_1, y_1, ..., x_i only (not on y_i or anything later)."""
    model = create_model(name, **tiny_overrides(name)).double().eval()
    cfg = model.config
    xs = torch.randn(2, cfg.max_points, cfg.n_dims, dtype=torch.double)
    ys = torch.randn(2, cfg.max_points, dtype=torch.double)
    ref = model(xs, ys)
    assert ref.shape == (2, cfg.max_points)
    i = 2
    xs2, ys2 = xs.clone(), ys.clone()
    ys2[:, i:] += torch.randn_like(ys2[:, i:])  # y_i and later
    xs2[:, i + 1 :] += torch.randn_like(xs2[:, i + 1 :])  # x_{i+1} and later
    out = model(xs2, ys2)
    torch.testing.assert_close(out[:, : i + 1], ref[:, : i + 1], rtol=0, atol=1e-12)
    assert not torch.allclose(out[:, i + 1 :], ref[:, i + 1 :])
    with pytest.raises(ValueError, match="ys must have shape"):
        model(xs, ys[:, :-1])
    with pytest.raises(ValueError, match="max_points"):
        model(
            torch.randn(1, cfg.max_points + 1, cfg.n_dims, dtype=torch.double),
            torch.randn(1, cfg.max_points + 1, dtype=torch.double),
        )
