"""The adapted decoders' decoding path: token-by-token decoding with ``transformers``' cache equals the parallel
forward, and the state it keeps does not grow with the context."""

import pytest
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken
import torch  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from attnzoo.adapt import make_student  # noqa: E402
from attnzoo.hf.swap import SwappedAttention  # noqa: E402

#: name -> (mechanism, options); "grouped": the teacher's 2 key/value heads kept, each shared by 2 query heads
MECHANISMS = {
    "linear": ("linear", {}),
    "tssa": ("tssa", {}),
    "fastmax": ("fastmax", {"p": 1, "scale": 1 / 8}),
    "linear-grouped": ("linear", {"kv_heads": 2}),
    "fastmax-grouped": ("fastmax", {"p": 1, "scale": 1 / 8, "kv_heads": 2}),
    "fastmax2-grouped": ("fastmax", {"p": 2, "kv_heads": 2}),
}


def _teacher():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def _student(name: str):
    mechanism, options = MECHANISMS[name]
    return make_student(_teacher(), mechanism, options).model.eval()


def _state_numel(state) -> int:
    """Elements of every tensor in a decoding state (dicts, tuples, named tuples)."""
    if isinstance(state, torch.Tensor):
        return state.numel()
    if isinstance(state, dict):
        return sum(_state_numel(v) for v in state.values())
    if isinstance(state, (tuple, list)):
        return sum(_state_numel(v) for v in state)
    return 0


def _decode(model, ids: torch.Tensor, prompt: int):
    """Logits ``(1, N, V)`` from a prefill of ``prompt`` tokens then one token per call, and the cache used."""
    cache = DynamicCache()
    logits = [model(input_ids=ids[:, :prompt], cache=cache, use_cache=True).logits]
    for t in range(prompt, ids.shape[1]):
        logits.append(model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True).logits)
    return torch.cat(logits, dim=1), cache


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@torch.no_grad()
def test_recurrent_decoding_equals_the_parallel_forward(one_thread, mechanism):
    model = _student(mechanism)
    ids = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(1))
    parallel = model(input_ids=ids, use_cache=False).logits
    decoded, _ = _decode(model, ids, prompt=5)
    torch.testing.assert_close(decoded, parallel, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@torch.no_grad()
def test_the_decoding_state_does_not_grow_with_the_context(one_thread, mechanism):
    model = _student(mechanism)
    layers = [m for m in model.modules() if isinstance(m, SwappedAttention)]
    ids = torch.randint(0, 64, (1, 100), generator=torch.Generator().manual_seed(2))
    sizes = []
    for n in (6, 30, 100):
        _, cache = _decode(model, ids[:, :n], prompt=4)
        sizes.append([_state_numel(layer._decoding[cache]["state"]) for layer in layers])
    assert sizes[0] == sizes[1] == sizes[2] and all(s > 0 for s in sizes[0])
    # per layer: the mechanism's state per query head (h = 4), or per key/value head (g = 2) where they are kept
    # f2: Fastmax p = 2's features of a head of 8 (1, k, the symmetric half of k (x) k)
    h, g, p, f2 = 4, 2, 8, 1 + 8 + 8 * 9 // 2
    want = {
        "linear": h * p * p + h * p,
        "tssa": 2 * h * p + h,
        "fastmax": h * (1 + p) * p + h * (1 + p),
        "linear-grouped": g * p * p + g * p,
        "fastmax-grouped": g * (1 + p) * p + g * (1 + p),
        "fastmax2-grouped": g * f2 * p + g * f2,
    }
    assert sizes[0] == [want[mechanism]] * len(layers)


@pytest.mark.parametrize("name", ["linear-grouped", "fastmax-grouped", "fastmax2-grouped"])
@torch.no_grad()
def test_grouped_key_value_heads_compute_what_the_repeated_ones_do(one_thread, name):
    """Kept grouped, the teacher's key/value projections give the swapped model of the default swap (which
    repeats them per query head) at a third less projection width and half the state here."""
    mechanism, options = MECHANISMS[name]
    grouped = make_student(_teacher(), mechanism, options)
    repeated = make_student(_teacher(), mechanism, {k: v for k, v in options.items() if k != "kv_heads"})
    layer = grouped.model.get_submodule(grouped.layers[0].name).mixer
    assert layer.kv_heads == 2 and tuple(layer.qkv.weight.shape) == (32 + 2 * 2 * 8, 32)
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(
        grouped.model(input_ids=ids).logits, repeated.model(input_ids=ids).logits, rtol=1e-5, atol=1e-5
    )
    assert "2 key/value heads kept, each shared by its query heads" in grouped.report


def test_grouped_key_value_heads_must_be_the_teachers():
    with pytest.raises(ValueError, match=r"kv_heads=1: the original has 2 key/value heads for 4 query heads; valid"):
        make_student(_teacher(), "linear", {"kv_heads": 1})
    from attnzoo.layers import build_attention

    with pytest.raises(ValueError, match=r"kv_heads=3 must divide heads=4; valid: \[1, 2, 4\] or None"):
        build_attention("linear", dim=32, heads=4, causal=True, kv_heads=3)


@pytest.mark.parametrize("mechanism", ["linear", "tssa", "fastmax", "linear-grouped"])
@torch.no_grad()
def test_a_prompt_is_projected_once_for_its_output_and_its_state(one_thread, mechanism):
    model = _student(mechanism)
    calls = []
    for layer in (m for m in model.modules() if isinstance(m, SwappedAttention)):
        layer.mixer.qkv.register_forward_hook(lambda *_: calls.append(1))
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(4))
    model(input_ids=ids, cache=DynamicCache(), use_cache=True)
    assert len(calls) == 2  # two layers, one projection of the prompt each
