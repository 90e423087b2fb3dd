"""Grouped key/value heads (``kv_heads``) of linear attention and Fastmax: the layer equals the one whose key/value
projections are repeated per query head, decodes step by step as it runs in parallel, and keeps its state per
key/value head."""

import pytest
import torch

from attnzoo.layers import build_attention
from attnzoo.models.prefill import prefill

DIM, HEADS, GROUPS, P = 32, 4, 2, 8
LAYERS = {"linear": {}, "fastmax-p1": {"p": 1, "scale": 1 / 8}, "fastmax-p2": {"p": 2}}


def _layers(name: str):
    """``(grouped, repeated)``: the layer with 2 key/value heads, and the plain one holding its weights repeated."""
    mechanism = name.split("-")[0]
    torch.manual_seed(0)
    grouped = build_attention(mechanism, dim=DIM, heads=HEADS, causal=True, kv_heads=GROUPS, **LAYERS[name])
    repeated = build_attention(mechanism, dim=DIM, heads=HEADS, causal=True, **LAYERS[name])
    w, b = grouped.qkv.weight, grouped.qkv.bias
    q, k, v = w.split([DIM, GROUPS * P, GROUPS * P])
    qb, kb, vb = b.split([DIM, GROUPS * P, GROUPS * P])

    def rep(t):
        return t.reshape(GROUPS, P, *t.shape[1:]).repeat_interleave(HEADS // GROUPS, 0).reshape(HEADS * P, *t.shape[1:])

    with torch.no_grad():
        repeated.qkv.weight.copy_(torch.cat([q, rep(k), rep(v)]))
        repeated.qkv.bias.copy_(torch.cat([qb, rep(kb), rep(vb)]))
        repeated.proj.load_state_dict(grouped.proj.state_dict())
    return grouped.eval(), repeated.eval()


@pytest.mark.parametrize("name", sorted(LAYERS))
@torch.no_grad()
def test_grouped_layer_equals_the_repeated_one_and_decodes_as_it_runs_in_parallel(name):
    grouped, repeated = _layers(name)
    assert tuple(grouped.qkv.weight.shape) == (DIM + 2 * GROUPS * P, DIM)
    x = torch.randn(2, 12, DIM, generator=torch.Generator().manual_seed(1))
    want = repeated(x)
    torch.testing.assert_close(grouped(x), want, rtol=1e-5, atol=1e-5)
    # a prompt of 5 tokens in parallel, then one token per step
    out, state = prefill(grouped, x[:, :5])
    steps = [out]
    for t in range(5, 12):
        y, state = grouped.step(x[:, t : t + 1], state)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, dim=1), want, rtol=1e-4, atol=1e-5)
    shapes = {tuple(t.shape[:2]) for t in (state.values() if isinstance(state, dict) else state)}
    assert shapes == {(2, GROUPS)}  # the state per key/value head
    empty = grouped.init_state(2)
    assert {tuple(t.shape[:2]) for t in (empty.values() if isinstance(empty, dict) else empty)} == {(2, GROUPS)}


@pytest.mark.parametrize("name", sorted(LAYERS))
@torch.no_grad()
def test_grouped_layer_prefills_a_padded_prompt_as_the_prompt_alone(name):
    grouped, _ = _layers(name)
    x = torch.randn(2, 9, DIM, generator=torch.Generator().manual_seed(2))
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, :3] = False  # row 1: three padding tokens, then its prompt
    _, padded = prefill(grouped, x, keep)
    _, alone = prefill(grouped, x[1:, 3:])
    pairs = zip(*((s.values() if isinstance(s, dict) else s) for s in (padded, alone)), strict=True)
    for a, b in pairs:
        torch.testing.assert_close(a[1:], b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mechanism", ["linear", "fastmax"])
def test_kv_heads_must_divide_heads(mechanism):
    with pytest.raises(ValueError, match=r"kv_heads=3 must divide heads=4; valid: \[1, 2, 4\] or None"):
        build_attention(mechanism, dim=DIM, heads=HEADS, causal=True, kv_heads=3)
    with pytest.raises(ValueError, match="kv_heads"):
        build_attention(mechanism, dim=DIM, heads=HEADS, causal=True, kv_heads=0)
