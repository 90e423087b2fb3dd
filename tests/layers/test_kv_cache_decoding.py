"""Decoding padded batches and prefilling: softmax and MSSA (key/value caches), Fastmax (moment sums).

A padded row decoded token by token (``step`` with the ``(B, t + 1)`` mask of the tokens fed so far) equals the
layer's masked causal forward, hence each row alone; ``prefill`` gives the state that replaying the prompt through
``step`` gives, padded prompts included, and both decode the same continuation (float64).
"""

from __future__ import annotations

import pytest
import torch

from attnzoo.layers.fastmax import FastmaxAttention
from attnzoo.layers.mssa import MSSAAttention
from attnzoo.layers.softmax import SoftmaxAttention

DIM, HEADS = 16, 2
GROWING = {
    "softmax": lambda: SoftmaxAttention(DIM, HEADS, causal=True),
    "mssa": lambda: MSSAAttention(DIM, HEADS, causal=True),
    "mssa-normq": lambda: MSSAAttention(DIM, HEADS, causal=True, normalize_query=True, out_proj=False),
}
FIXED = {
    "fastmax-p1": lambda: FastmaxAttention(DIM, HEADS, causal=True, p=1, scale=0.25),
    "fastmax-p2": lambda: FastmaxAttention(DIM, HEADS, causal=True, p=2),
}
LAYERS = {**GROWING, **FIXED}


def _layer(name: str):
    torch.manual_seed(0)
    return LAYERS[name]().double().eval()


def _mask(kind: str, b: int, n: int) -> torch.Tensor | None:
    """``(B, N)`` bool: left / right padding of random lengths (one row with a single token), holes, or none."""
    if kind == "none":
        return None
    g = torch.Generator().manual_seed(n)
    lengths = [n, 1] + torch.randint(1, n + 1, (b - 2,), generator=g).tolist()
    pos = torch.arange(n)
    lens = torch.tensor(lengths)[:, None]
    if kind == "left":
        return pos >= n - lens
    if kind == "right":
        return pos < lens
    holes = torch.rand(b, n, generator=g) < 0.6
    holes[:, 0] = True  # a real token in every row
    return holes


def _x(b: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, n, DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _steps(layer, x: torch.Tensor, mask: torch.Tensor | None, state=None):
    """Feed ``x (B, N, dim)`` token by token: outputs ``(B, N, dim)`` and the state after them."""
    state = layer.init_state(x.shape[0]) if state is None else state
    outs = []
    for t in range(x.shape[1]):
        kw = {} if mask is None else {"attention_mask": mask[:, : t + 1]}
        y, state = layer.step(x[:, t : t + 1], state, **kw)
        outs.append(y)
    return torch.cat(outs, dim=1), state


def _leaves(state) -> dict[str, torch.Tensor]:
    return dict(state.items()) if isinstance(state, dict) else state._asdict()


@pytest.mark.parametrize("kind", ["left", "right", "holes"])
@pytest.mark.parametrize("n", [1, 6, 9])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_padded_decoding_equals_the_masked_causal_forward(name, n, kind):
    layer = _layer(name)
    x = _x(4, n)
    mask = _mask(kind, 4, n)
    with torch.no_grad():
        stepped, _ = _steps(layer, x, mask)
        ref = layer(x, attention_mask=mask)
    torch.testing.assert_close(stepped, ref, rtol=1e-10, atol=1e-12)
    assert torch.equal(stepped[~mask], torch.zeros_like(stepped[~mask]))  # padding gives 0, bias included


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_padding_tokens_do_not_reach_the_real_ones(name):
    # leak test: whatever the padding tokens hold (huge values included), the real tokens' outputs are bit for bit
    # the same
    layer = _layer(name)
    x = _x(4, 7)
    mask = _mask("holes", 4, 7)
    loud = torch.where(mask[..., None], x, 1e3 * _x(4, 7, seed=9))
    with torch.no_grad():
        a, _ = _steps(layer, x, mask)
        b, _ = _steps(layer, loud, mask)
    assert torch.equal(a[mask], b[mask])


@pytest.mark.parametrize("kind", ["none", "left", "right", "holes"])
@pytest.mark.parametrize("n", [1, 7, 67])  # 67: more than one chunk of Fastmax's sums
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_prefill_state_equals_replaying_the_prompt(name, n, kind):
    layer = _layer(name)
    b = 3
    x, nxt = _x(b, n), _x(b, 4, seed=2)
    mask = _mask(kind, b, n)
    with torch.no_grad():
        out, state = layer.prefill(x, attention_mask=mask)
        ref = layer(x) if mask is None else layer(x, attention_mask=mask)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
        replayed_out, replayed = _steps(layer, x, mask)
        torch.testing.assert_close(out, replayed_out, rtol=1e-10, atol=1e-12)
        real = torch.ones(b, n, dtype=torch.bool) if mask is None else mask
        for key, u in _leaves(state).items():
            v = _leaves(replayed)[key]
            assert u.dtype == v.dtype and u.shape == v.shape, key
            if name in GROWING:  # one slot per token; the padding slots are never read
                u, v = u.transpose(1, 2)[real], v.transpose(1, 2)[real]
            torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12, msg=key)
        # both decode the same continuation (all real tokens after the prompt)
        later = None if mask is None else torch.cat([mask, torch.ones(b, 4, dtype=torch.bool)], dim=1)
        cont, _ = _continue(layer, nxt, state, later, n)
        ref_cont, _ = _continue(layer, nxt, replayed, later, n)
        torch.testing.assert_close(cont, ref_cont, rtol=1e-10, atol=1e-12)
        full = torch.cat([x, nxt], dim=1)
        whole = layer(full) if later is None else layer(full, attention_mask=later)
        torch.testing.assert_close(cont, whole[:, n:], rtol=1e-10, atol=1e-12)


def _continue(layer, x: torch.Tensor, state, mask: torch.Tensor | None, seen: int):
    outs = []
    for t in range(x.shape[1]):
        kw = {} if mask is None else {"attention_mask": mask[:, : seen + t + 1]}
        y, state = layer.step(x[:, t : t + 1], state, **kw)
        outs.append(y)
    return torch.cat(outs, dim=1), state


def test_prefill_state_dtype_matches_init_state_in_float32():
    layer = _layer("fastmax-p2").float()
    _, state = layer.prefill(_x(2, 5).float())
    fresh = layer.init_state(2)
    assert state.num.dtype == fresh.num.dtype and state.den.dtype == fresh.den.dtype


@pytest.mark.parametrize("name", sorted(GROWING))
def test_a_mask_of_the_wrong_length_is_refused(name):
    layer = _layer(name)
    x = _x(2, 3)
    _, state = layer.prefill(x)
    with pytest.raises(ValueError, match=r"attention_mask \(the mask of every token fed so far.*\(2, 4\)"):
        layer.step(x[:, :1], state, attention_mask=torch.ones(2, 3, dtype=torch.bool))


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_prefill_needs_a_causal_layer(name):
    layer = type(LAYERS[name]())(DIM, HEADS)  # bidirectional: there is no decoding state to fill
    with pytest.raises(ValueError, match="causal"):
        layer.prefill(_x(1, 3).float())
