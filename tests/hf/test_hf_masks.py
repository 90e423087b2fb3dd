"""``transformers`` decoding with padded prompts: batched ``generate()`` equals generating from each prompt alone."""

import functools
import sys
from pathlib import Path

import pytest
import torch
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken

from transformers import AutoModelForCausalLM  # noqa: E402

import attnzoo.hf as H  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from masked_softmax import use_masked_softmax  # noqa: E402

TINY_LM = dict(dim=32, depth=2, heads=4, vocab_size=61, block_size=40)
LOCAL = "masked-softmax"
# (label, mechanism, options): the fixed-state mechanisms keep a row's state at its padding; the key/value caches
# (softmax, MSSA) keep a slot per token and their step skips the padding ones by the mask of the tokens fed so far
MECHANISMS = [
    ("tssa", "tssa", {}),
    ("fastmax-p1", "fastmax", {"p": 1}),
    ("fastmax-p2", "fastmax", {"p": 2}),
    ("linear", "linear", {}),
    ("softmax", "softmax", {}),
    ("mssa", "mssa", {}),
    (LOCAL, "softmax", {}),
]
PROMPTS = [[5, 9, 2, 7, 1], [3], [8, 8, 4, 6, 2, 9, 11, 30]]


def tiny_lm(mechanism: str, options: dict, masked: bool = False) -> "H.AttnZooForCausalLM":
    torch.manual_seed(0)
    cfg = H.AttnZooCausalLMConfig(**{**TINY_LM, "attention": mechanism, "attention_options": options})
    model = AutoModelForCausalLM.from_config(cfg).eval()
    return use_masked_softmax(model) if masked else model


def padded(side: str, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The PROMPTS padded on ``side`` as a tokenizer does: ``(input_ids, attention_mask)``."""
    n = max(map(len, PROMPTS))
    ids = torch.full((len(PROMPTS), n), pad)
    mask = torch.zeros(len(PROMPTS), n, dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        sl = slice(n - len(p), n) if side == "left" else slice(0, len(p))
        ids[i, sl], mask[i, sl] = torch.tensor(p), 1
    return ids, mask


def _generate(model, ids, mask, **kw):
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_logits=True,
        **kw,
    )


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize(("label", "mechanism", "options"), MECHANISMS, ids=[m[0] for m in MECHANISMS])
def test_generate_from_padded_prompts_equals_each_prompt_alone(label, mechanism, options, side):
    model = tiny_lm(mechanism, options, masked=label == LOCAL)
    ids, mask = padded(side)
    out = _generate(model, ids, mask)
    assert isinstance(out.past_key_values, H.RecurrentCache)
    for i, p in enumerate(PROMPTS):
        alone = _generate(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long))
        assert torch.equal(out.sequences[i, -6:], alone.sequences[0, -6:]), (i, out.sequences[i], alone.sequences)
        for a, b in zip(out.logits, alone.logits, strict=True):
            torch.testing.assert_close(a[i], b[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize(("label", "mechanism", "options"), MECHANISMS[:-1], ids=[m[0] for m in MECHANISMS[:-1]])
def test_padded_prompts_are_prefilled_not_stepped(label, mechanism, options, side, monkeypatch):
    model = tiny_lm(mechanism, options)
    ids, mask = padded(side)
    cls = type(model.model.blocks[0].attn)
    calls = []
    step = cls.step
    # a counting wrapper with step's own signature: whether step takes attention_mask is read from it (and cached)
    monkeypatch.setattr(
        cls, "step", functools.wraps(step)(lambda self, *a, **k: calls.append(1) or step(self, *a, **k))
    )
    out = _generate(model, ids, mask)
    assert len(calls) == 5 * len(model.model.blocks)  # the prompt in one parallel pass, then the 5 fed new tokens
    monkeypatch.undo()
    plain = _generate(model, ids, mask, use_cache=False)
    assert torch.equal(out.sequences, plain.sequences)
    for a, b in zip(out.logits, plain.logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_generate_without_cache_from_left_padded_prompts():
    # the parallel forward hands the mask to the layers: the masked layer equals each prompt alone ...
    model = tiny_lm("softmax", {}, masked=True)
    ids, mask = padded("left")
    out = _generate(model, ids, mask, use_cache=False)
    for i, p in enumerate(PROMPTS):
        alone = _generate(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long), use_cache=False)
        assert torch.equal(out.sequences[i, -6:], alone.sequences[0, -6:])
    # ... and a layer that cannot honour it is an error naming it, never ignored
    unmasked = tiny_lm("linear", {})
    for blk in unmasked.model.blocks:
        blk.attn.supports_masks = False  # as a layer that has not been updated
    with pytest.raises(ValueError, match="attention 'linear' does not honour attention_mask"):
        unmasked(ids, attention_mask=mask)


def test_parallel_forward_with_padding():
    model = tiny_lm("linear", {})
    ids = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(1))
    right = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    full = model(ids).logits
    out = model(ids, attention_mask=right).logits
    # trailing padding needs no mask in a causal model: the real positions are unchanged, the padding positions
    # repeat their row's last real logits (generate() reads the last position)
    torch.testing.assert_close(out[0], full[0], rtol=0, atol=0)
    torch.testing.assert_close(out[1, :3], full[1, :3], rtol=0, atol=0)
    torch.testing.assert_close(out[1, 3:], full[1, 2:3].expand(2, -1), rtol=1e-5, atol=1e-6)
    # the cached forward agrees, padding included
    cached = model(ids, attention_mask=right, use_cache=True).logits
    torch.testing.assert_close(cached, out, rtol=1e-4, atol=1e-5)
    # a left-padded row through the masked layer equals that row alone, parallel and cached
    masked = tiny_lm("softmax", {}, masked=True)
    left = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    alone = masked(ids[1:, 2:]).logits
    for kw in ({}, {"use_cache": True}):
        out = masked(ids, attention_mask=left, **kw).logits
        torch.testing.assert_close(out[1, 2:], alone[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(out[1, :2], torch.zeros_like(out[1, :2]))  # no real token yet: zero logits
    with pytest.raises(ValueError, match="only 0 and 1"):
        model(ids, attention_mask=right * 2)


@pytest.mark.parametrize("mechanism", ["tssa", "linear"])
def test_beam_search_from_left_padded_prompts_equals_each_alone(mechanism):
    # the cache's per-row positions, padding history and per-row state ints follow the beams
    model = tiny_lm(mechanism, {})
    ids, mask = padded("left")
    kw = dict(max_new_tokens=4, num_beams=3, do_sample=False, pad_token_id=0)
    out = model.generate(ids, attention_mask=mask, **kw)
    for i, p in enumerate(PROMPTS):
        alone = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), **kw)
        assert torch.equal(out[i, -4:], alone[0, -4:])
