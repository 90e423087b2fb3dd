"""The adapted decoders' decoding path: token-by-token decoding with ``transformers``' cache equals the parallel
forward, and the state it keeps does not grow with the context."""

import pytest
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken
import torch  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from attnzoo.adapt import make_student  # noqa: E402
from attnzoo.hf.swap import SwappedAttention  # noqa: E402

MECHANISMS = {"linear": {}, "tssa": {}, "fastmax": {"p": 1, "scale": 1 / 8}}


def _student(mechanism: str):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2,
    )  # fmt: skip
    teacher = LlamaForCausalLM(cfg).eval()
    return make_student(teacher, mechanism, MECHANISMS[mechanism]).model.eval()


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
    # per layer: the mechanism's state at its query heads (GQA's shared key/value heads repeated per query head)
    h, p = 4, 8
    want = {"linear": h * p * p + h * p, "tssa": 2 * h * p + h, "fastmax": h * (1 + p) * p + h * (1 + p)}
    assert sizes[0] == [want[mechanism]] * len(layers)
