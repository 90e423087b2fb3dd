"""swap_attention on tiny random transformers GPT-2, Llama and ViT models (built offline, nothing downloaded)."""

import pytest
import torch
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken

from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    ViTConfig,
    ViTForImageClassification,
)

import attnzoo  # noqa: E402
from attnzoo.hf import SwapReport, swap_attention  # noqa: E402
from attnzoo.hf.swap import SwappedAttention  # noqa: E402

# a mechanism that owns its residual update (MEGA) is a block, not an attention module: swap refuses it (below)
CAUSAL = [n for n in attnzoo.list_attentions(causal=True) if not attnzoo.attention_info(n).owns_residual]
BIDIRECTIONAL = [n for n in attnzoo.list_attentions(causal=False) if not attnzoo.attention_info(n).owns_residual]
VOCAB = 53


def gpt2(**kw) -> GPT2LMHeadModel:
    cfg = dict(
        n_embd=32,
        n_layer=2,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(GPT2Config(**{**cfg, **kw})).eval()


def llama(**kw) -> LlamaForCausalLM:
    # grouped key/value heads (2 for 4 query heads), as in Llama 2/3, Mistral
    cfg = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return LlamaForCausalLM(LlamaConfig(**{**cfg, **kw})).eval()


def vit(**kw) -> ViTForImageClassification:
    cfg = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return ViTForImageClassification(ViTConfig(**{**cfg, **kw})).eval()


DECODERS = {"gpt2": gpt2, "llama": llama}


def ids(b=2, t=9, seed=0):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def images(b=2, seed=0):
    return torch.randn(b, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def _optimise(model, loss_fn, steps=4, lr=3e-3) -> list[float]:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_fn()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("arch", sorted(DECODERS))
@pytest.mark.parametrize("mechanism", CAUSAL)
def test_decoder_swap_forward_backward_leak_and_training(arch, mechanism):
    model = DECODERS[arch]()
    report = swap_attention(model, mechanism)
    assert isinstance(report, SwapReport) and len(report.layers) == 2 and not report.skipped
    swapped = [m for m in model.modules() if isinstance(m, SwappedAttention)]
    assert len(swapped) == 2
    assert all(type(m.mixer).registry_name == mechanism and m.mixer.causal for m in swapped)
    x = ids()
    # causal leak test: changing token j leaves every logit before j unchanged, and changes some after it
    model.eval()
    with torch.no_grad():
        base = model(x).logits
        for j in (3, 8):
            y = x.clone()
            y[:, j] = (y[:, j] + 1) % VOCAB
            out = model(y).logits
            torch.testing.assert_close(out[:, :j], base[:, :j], rtol=0, atol=0)
            assert not torch.allclose(out[:, j:], base[:, j:])
    # backward reaches the new mechanism's parameters and the model's own
    out = model(x, labels=x)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    for m in swapped:
        grads = [p.grad for p in m.mixer.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)
    model.zero_grad()
    # a few optimiser steps on one batch lower its loss
    losses = _optimise(model, lambda: model(x, labels=x).loss)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("arch", sorted(DECODERS))
@pytest.mark.parametrize("mechanism", CAUSAL)
def test_swapped_decoder_generates_with_transformers_cache(arch, mechanism):
    model = DECODERS[arch]()
    swap_attention(model, mechanism)
    prompt = ids(2, 5, seed=1)
    kw = dict(
        max_new_tokens=6,
        do_sample=False,
        return_dict_in_generate=True,
        output_logits=True,
        attention_mask=torch.ones_like(prompt),
        pad_token_id=0,
    )
    cached = model.generate(prompt, use_cache=True, **kw)
    plain = model.generate(prompt, use_cache=False, **kw)
    # the mechanism's own recurrent state / KV cache continues the prompt exactly as re-running the prefix does
    assert torch.equal(cached.sequences, plain.sequences)
    for a, b in zip(cached.logits, plain.logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mechanism", BIDIRECTIONAL)
def test_vit_swap_forward_backward_and_training(mechanism):
    model = vit()
    report = swap_attention(model, mechanism)
    assert len(report.layers) == 2 and not any(layer.causal for layer in report.layers)
    x, labels = images(4), torch.tensor([0, 1, 2, 0])
    out = model(pixel_values=x, labels=labels)
    assert out.logits.shape == (4, 3) and torch.isfinite(out.loss)
    out.loss.backward()
    for m in model.modules():
        if isinstance(m, SwappedAttention):
            assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.mixer.parameters())
    model.zero_grad()
    # bidirectional: the first token (CLS) sees the last patch
    model.eval()
    with torch.no_grad():
        y = x.clone()
        y[:, :, -4:, -4:] += 1.0
        assert not torch.allclose(model(pixel_values=y).logits, model(pixel_values=x).logits)
    losses = _optimise(model, lambda: model(pixel_values=x, labels=labels).loss)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("arch", sorted(DECODERS))
def test_softmax_swap_into_a_decoder_reproduces_it(arch):
    # attnzoo's softmax with the copied q/k/v/o weights (Llama: grouped kv heads repeated, biases, rotary
    # embedding applied to q and k) computes the original attention: the same logits
    model = DECODERS[arch](**({"attention_bias": True} if arch == "llama" else {}))
    x = ids()
    with torch.no_grad():
        ref = model(x).logits
    report = swap_attention(model, "softmax")
    assert all(layer.reused == ["q", "k", "v", "o"] and not layer.not_reused for layer in report.layers)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, ref, rtol=1e-5, atol=1e-6)


def test_softmax_swap_into_vit_reproduces_it():
    # GPT-2 and Llama: test_softmax_swap_into_a_decoder_reproduces_it
    model = vit()
    x = images()
    with torch.no_grad():
        ref = model(pixel_values=x).logits
    swap_attention(model, "softmax")
    with torch.no_grad():
        torch.testing.assert_close(model(pixel_values=x).logits, ref, rtol=1e-5, atol=1e-6)


def test_llama_grouped_kv_heads_are_repeated_into_the_fused_projection():
    model = llama(attention_bias=True)
    attn = model.model.layers[1].self_attn
    q, k, v, o = (getattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    q, k, v, o = [(m.weight.detach().clone(), m.bias.detach().clone()) for m in (q, k, v, o)]
    report = swap_attention(model, "linear")
    assert "2 key/value heads repeated to 4" in report.notes
    assert any("rotary position embeddings rotate" in n for n in report.notes)
    assert any("rotary position embeddings are not applied" in n for n in swap_attention(llama(), "tssa").notes)
    mixer = model.model.layers[1].self_attn.mixer
    w, b = mixer.qkv.weight.detach(), mixer.qkv.bias.detach()
    # head h of the keys/values is kv head h // 2 (head_dim 8)
    k_rep = k[0].reshape(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
    v_rep = v[0].reshape(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
    assert torch.equal(w, torch.cat([q[0], k_rep, v_rep]))
    assert torch.equal(
        b,
        torch.cat(
            [
                q[1],
                k[1].reshape(2, 8).repeat_interleave(2, 0).reshape(-1),
                v[1].reshape(2, 8).repeat_interleave(2, 0).reshape(-1),
            ]
        ),
    )
    assert torch.equal(mixer.proj.weight, o[0]) and torch.equal(mixer.proj.bias, o[1])


def test_report_says_what_could_not_be_reused():
    model = gpt2()
    report = swap_attention(model, "tssa")
    layer = report.layers[0]
    assert layer.name == "transformer.h.0.attn" and layer.original == "GPT2Attention" and layer.causal
    assert layer.reused == ["o"] and set(layer.not_reused) == {"q", "k", "v"}
    assert {"temp", "bias", "qkv.weight"} <= set(layer.new)  # TSSA's own parameters start fresh
    text = str(report)
    assert "not reused q" in text and "transformer.h.1.attn" in text
    csp = swap_attention(vit(), "csp").layers[0]
    assert csp.reused == ["v", "o"] and set(csp.not_reused) == {"q", "k"}


def test_options_reach_the_mechanism_and_cross_attention_is_skipped():
    model = gpt2(add_cross_attention=True)
    report = swap_attention(model, "fastmax", p=1)
    assert len(report.layers) == 2 and len(report.skipped) == 2
    assert all("cross-attention" in why for why in report.skipped.values())
    assert all(m.mixer.p == 1 for m in model.modules() if isinstance(m, SwappedAttention))
    assert type(model.transformer.h[0].crossattention).__name__ == "GPT2Attention"


def test_bad_requests_raise_clear_errors():
    with pytest.raises(ValueError, match="no causal mode"):
        swap_attention(gpt2(), "xca")
    with pytest.raises(ValueError, match="unknown mechanism 'flash'"):
        swap_attention(gpt2(), "flash")
    with pytest.raises(ValueError, match="mechanism 'mega' computes its own normalisation and residual update"):
        swap_attention(vit(), "mega")
    with pytest.raises(ValueError, match="mechanism 'mega' computes its own normalisation and residual update"):
        swap_attention(gpt2(), "mega")  # the causal MEGA too
    with pytest.raises(ValueError, match="config.hidden_size"):
        swap_attention(torch.nn.Linear(2, 2), "softmax")
    with pytest.raises(TypeError, match="unknown option"):
        swap_attention(llama(), "tssa", nonsense=1)


# ---------------------------------------------------------------------------------------------------
# Which pretrained weights end up where: read from each mechanism's Mechanism.projections
# ---------------------------------------------------------------------------------------------------

#: the built-in mechanisms' layouts, spelled out: pretrained role -> the mechanism's projection it is copied into
SWAP_LAYOUTS = {
    "softmax": {"qkv": "qkv", "o": "proj"},
    "linear": {"qkv": "qkv", "o": "proj"},
    "fastmax": {"qkv": "qkv", "o": "proj"},
    "xca": {"qkv": "qkv", "o": "proj"},
    "csp": {"v": "v_proj", "o": "proj"},
    "tssa": {"o": "to_out"},  # one projection U shared as q, k and v: nothing to copy into it
    "mssa": {"o": "to_out"},
    "cbsa": {"o": "to_out"},  # `proj` is CBSA's input subspace projection U, not its output
}
SWAPPABLE = [n for n in attnzoo.list_attentions() if not attnzoo.attention_info(n).owns_residual]


def _pretrained_weights(module) -> dict:
    """Role -> (out, in) weight of a GPT-2 or ViT attention module, before the swap."""
    if hasattr(module, "c_attn"):  # GPT-2's Conv1D stores (in, out); c_attn is (q | k | v)
        q, k, v = module.c_attn.weight.detach().t().clone().chunk(3, dim=0)
        return {"q": q, "k": k, "v": v, "o": module.c_proj.weight.detach().t().clone()}
    return {r: getattr(module, f"{r}_proj").weight.detach().clone() for r in ("q", "k", "v", "o")}


@pytest.mark.parametrize("mechanism", SWAPPABLE)
def test_swap_copies_each_pretrained_projection_where_the_mechanism_declares_it(mechanism):
    spec = attnzoo.attention_info(mechanism).mechanism
    layout = spec.projections.copied()
    if mechanism in SWAP_LAYOUTS:
        assert layout == SWAP_LAYOUTS[mechanism]
    causal = attnzoo.attention_info(mechanism).supports_causal
    model = gpt2() if causal else vit()
    names = [n for n, m in model.named_modules() if type(m).__name__ in ("GPT2Attention", "ViTAttention")]
    before = {n: _pretrained_weights(model.get_submodule(n)) for n in names}
    report = swap_attention(model, mechanism)
    assert [layer.name for layer in report.layers] == names
    for layer in report.layers:
        mixer = model.get_submodule(layer.name).mixer
        orig = before[layer.name]
        expected = {"qkv": torch.cat([orig["q"], orig["k"], orig["v"]])} | orig
        for role, attr in layout.items():
            assert torch.equal(getattr(mixer, attr).weight, expected[role]), (role, attr)
        roles = [r for role in layout for r in (["q", "k", "v"] if role == "qkv" else [role])]
        assert layer.reused == [r for r in ("q", "k", "v", "o") if r in roles]
        assert set(layer.not_reused) == {"q", "k", "v", "o"} - set(roles)
        # every other projection starts fresh: no pretrained weight lands anywhere else
        for name, p in mixer.named_parameters():
            if name.split(".")[0] not in layout.values():
                assert not any(p.shape == w.shape and torch.equal(p, w) for w in expected.values()), name
                assert name in layer.new


def test_cbsa_swap_puts_the_output_projection_into_to_out_not_its_subspace_projection():
    # CBSA's `proj` is the subspace bases U_[K] (its input projection), `to_out` its output projection
    model = vit()
    o = model.vit.layers[0].attention.o_proj.weight.detach().clone()
    report = swap_attention(model, "cbsa")
    mixer = model.vit.layers[0].attention.mixer
    assert torch.equal(mixer.to_out.weight, o)
    assert not torch.equal(mixer.proj.weight, o)
    assert report.layers[0].reused == ["o"] and set(report.layers[0].not_reused) == {"q", "k", "v"}
    assert "proj.weight" in report.layers[0].new and "to_out.weight" not in report.layers[0].new
