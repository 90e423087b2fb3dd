"""Swapped GPT-2 / Llama with padded batches: ``transformers``' attention_mask reaches the mechanism, never ignored."""

import functools
import sys
from pathlib import Path

import pytest
import torch
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken

from test_hf_swap import VOCAB, gpt2, llama  # noqa: E402

from attnzoo.hf import swap_attention  # noqa: E402
from attnzoo.hf.swap import SwappedAttention  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from masked_softmax import use_masked_softmax  # noqa: E402

DECODERS = {"gpt2": gpt2, "llama": llama}
PROMPTS = [[5, 9, 2, 7, 1], [3], [8, 8, 4, 6, 2, 9, 11, 30]]
# the causal mechanisms a transformers attention module can be swapped for (Fastmax at its default p=2)
SWAPPABLE = ["softmax", "mssa", "tssa", "linear", "fastmax"]


def padded(side: str = "left") -> tuple[torch.Tensor, torch.Tensor]:
    n = max(map(len, PROMPTS))
    ids = torch.randint(0, VOCAB, (len(PROMPTS), n), generator=torch.Generator().manual_seed(3))  # loud padding
    mask = torch.zeros(len(PROMPTS), n, dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        sl = slice(n - len(p), n) if side == "left" else slice(0, len(p))
        ids[i, sl], mask[i, sl] = torch.tensor(p), 1
    return ids, mask


def swapped(arch: str, mechanism: str, impl: str = "sdpa"):
    torch.manual_seed(0)
    model = DECODERS[arch](attn_implementation=impl)
    swap_attention(model, mechanism)
    return model


def _generate(model, ids, mask, **kw):
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=5,
        do_sample=False,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_scores=True,
        **kw,
    )


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", sorted(DECODERS))
def test_masked_softmax_swap_left_padded_scores_equal_each_prompt_alone(arch, impl):
    model = use_masked_softmax(swapped(arch, "softmax", impl))
    ids, mask = padded("left")
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # what generate() passes for left padding
    with torch.no_grad():
        out = model(ids, attention_mask=mask, position_ids=positions).logits
        for i, p in enumerate(PROMPTS):
            alone = model(torch.tensor([p])).logits[0]
            torch.testing.assert_close(out[i, -len(p) :], alone, rtol=1e-5, atol=1e-5)
    batched = _generate(model, ids, mask)
    for i, p in enumerate(PROMPTS):
        one = _generate(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long))
        assert torch.equal(batched.sequences[i, -5:], one.sequences[0, -5:])
        for a, b in zip(batched.scores, one.scores, strict=True):
            torch.testing.assert_close(a[i], b[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mechanism", SWAPPABLE)
@pytest.mark.parametrize("arch", sorted(DECODERS))
def test_swapped_mechanisms_generate_from_left_padded_prompts_as_each_alone(arch, mechanism):
    # the padded prompt is prefilled through the masked parallel form; the key/value caches (softmax, MSSA) keep a
    # slot per token and skip the padding ones, the fixed-size states keep a row's state at its padding. (Left
    # padding only: transformers' generate() reads the last position's logits, a padding one when right-padded.)
    model = swapped(arch, mechanism)
    ids, mask = padded("left")
    batched = _generate(model, ids, mask)
    for i, p in enumerate(PROMPTS):
        one = _generate(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long))
        assert torch.equal(batched.sequences[i, -5:], one.sequences[0, -5:])
        for a, b in zip(batched.scores, one.scores, strict=True):
            torch.testing.assert_close(a[i], b[0], rtol=1e-4, atol=1e-5)
    # a forward with transformers' cache (use_cache defaults to True) takes the same path, and so does the
    # parallel forward without it
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        for kw in ({}, {"use_cache": False}):
            out = model(ids, attention_mask=mask, position_ids=positions, **kw).logits
            for i, p in enumerate(PROMPTS):
                alone = model(torch.tensor([p])).logits[0]
                torch.testing.assert_close(out[i, -len(p) :], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", sorted(DECODERS))
def test_right_padded_batch_equals_each_prompt_alone(arch):
    # right padding: a causal mechanism needs no mask for the real tokens
    model = swapped(arch, "softmax")
    ids, mask = padded("right")
    with torch.no_grad():
        out = model(ids, attention_mask=mask).logits
        for i, p in enumerate(PROMPTS):
            torch.testing.assert_close(out[i, : len(p)], model(torch.tensor([p])).logits[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("mechanism", SWAPPABLE)
@pytest.mark.parametrize("arch", sorted(DECODERS))
def test_prompt_is_prefilled_not_replayed(arch, mechanism, padding, monkeypatch):
    # the state of the parallel prompt pass goes to step: only the new tokens are stepped, padded prompts included
    model = swapped(arch, mechanism)
    mixer = next(m for m in model.modules() if isinstance(m, SwappedAttention)).mixer
    calls = []
    step = type(mixer).step
    # a counting wrapper with step's own signature: whether step takes attention_mask is read from it (and cached)
    monkeypatch.setattr(
        type(mixer), "step", functools.wraps(step)(lambda self, *a, **k: calls.append(1) or step(self, *a, **k))
    )
    prompt, mask = padded("left") if padding else (torch.tensor([PROMPTS[2]]), torch.ones(1, len(PROMPTS[2])))
    out = _generate(model, prompt, mask)
    per_layer = len(calls) // len(list(m for m in model.modules() if isinstance(m, SwappedAttention)))
    assert per_layer == 4
    monkeypatch.undo()
    plain = _generate(model, prompt, mask, use_cache=False)
    assert torch.equal(out.sequences, plain.sequences)
    for a, b in zip(out.scores, plain.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
