"""Models with ``attention_mask`` / ``cu_seqlens``: each sequence of a padded batch or packed row equals it alone.

Every mechanism is parametrised: where its layer honours masks (``supports_masks``) the outputs must equal each
sequence alone; where it does not yet, a mask must raise an error naming it (never be ignored). ``masked-softmax``
(a test-local layer, masked_softmax.py) exercises the plumbing whatever the real layers support.
"""

from __future__ import annotations

import functools

import pytest
import torch
from masked_softmax import use_masked_softmax

import attnzoo
from attnzoo.models.config import CausalLMConfig, SequenceClassifierConfig
from attnzoo.models.language import CausalLM
from attnzoo.models.masking import RowInts
from attnzoo.models.sequence import SequenceClassifier

LOCAL = "masked-softmax"
CAUSAL = attnzoo.list_attentions(causal=True) + [LOCAL]
BIDIRECTIONAL = attnzoo.list_attentions(causal=False) + [LOCAL]
LENGTHS = [5, 1, 8]
VOCAB = 29


def _masks(model) -> bool:
    return all(getattr(b.attn, "supports_masks", False) for b in model.blocks)


def _lm(mechanism: str, **kw) -> CausalLM:
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=VOCAB, block_size=16, dim=32, heads=4, depth=2, attention=_real(mechanism), **kw)
    model = CausalLM(cfg).double().eval()
    return use_masked_softmax(model) if mechanism == LOCAL else model


def _classifier(mechanism: str, **kw) -> SequenceClassifier:
    torch.manual_seed(0)
    cfg = SequenceClassifierConfig(
        vocab_size=VOCAB, max_len=16, dim=32, heads=4, depth=2, mlp_dim=48, attention=_real(mechanism), **kw
    )
    model = SequenceClassifier(cfg).double().eval()
    return use_masked_softmax(model) if mechanism == LOCAL else model


def _real(mechanism: str) -> str:
    return "softmax" if mechanism == LOCAL else mechanism


def _seqs(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in LENGTHS]


def _batch(seqs: list[torch.Tensor], mode: str, width: int | None = None):
    """``(ids, keywords, [(row, token indices)])`` of ``seqs`` padded (left/right, random pad ids) or packed."""
    g = torch.Generator().manual_seed(1)
    if mode == "packed":
        ids = torch.cat(seqs)[None]
        cu = torch.tensor([0] + torch.tensor([len(s) for s in seqs]).cumsum(0).tolist(), dtype=torch.int32)
        where = [(0, torch.arange(int(cu[i]), int(cu[i + 1]))) for i in range(len(seqs))]
        return ids, {"cu_seqlens": cu}, where
    n = width or max(len(s) for s in seqs)
    ids = torch.randint(0, VOCAB, (len(seqs), n), generator=g)
    mask = torch.zeros(len(seqs), n, dtype=torch.long)
    where = []
    for i, s in enumerate(seqs):
        idx = torch.arange(n - len(s), n) if mode == "left" else torch.arange(len(s))
        ids[i, idx], mask[i, idx] = s, 1
        where.append((i, idx))
    return ids, {"attention_mask": mask}, where


@pytest.mark.parametrize("mode", ["left", "right", "packed"])
@pytest.mark.parametrize("mechanism", CAUSAL)
def test_causal_lm_logits_equal_each_sequence_alone(mechanism, mode):
    model = _lm(mechanism)
    seqs = _seqs()
    ids, kw, where = _batch(seqs, mode)
    if not _masks(model):
        with pytest.raises(ValueError, match=f"attention '{mechanism}' does not honour"):
            model(ids, **kw)
        return
    with torch.no_grad():
        out = model(ids, **kw)
        for s, (row, idx) in zip(seqs, where, strict=True):
            torch.testing.assert_close(out[row, idx], model(s[None])[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pos_embed", ["sinusoidal", "none"])
def test_causal_lm_positions_restart_per_sequence(pos_embed):
    model = _lm(LOCAL, pos_embed=pos_embed)
    seqs = _seqs(3)
    for mode in ("left", "packed"):
        ids, kw, where = _batch(seqs, mode)
        with torch.no_grad():
            out = model(ids, **kw)
            for s, (row, idx) in zip(seqs, where, strict=True):
                torch.testing.assert_close(out[row, idx], model(s[None])[0], rtol=1e-10, atol=1e-10)


# the mechanisms whose decoding state grows with the context (a key/value cache with a slot per token, padding
# included: their step takes the mask of the tokens fed so far); the others keep fixed-size states
GROWING = {"softmax", "mssa"}


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("mode", ["left", "right"])
@pytest.mark.parametrize("mechanism", CAUSAL)
def test_generate_from_padded_prompts_equals_each_alone(mechanism, mode, use_cache):
    model = _lm(mechanism)
    seqs = _seqs(5)
    ids, kw, _ = _batch(seqs, mode)
    if not use_cache and not _masks(model):
        with pytest.raises(ValueError, match=f"attention '{mechanism}' does not honour"):
            model.generate(ids, 5, temperature=0, use_cache=False, **kw)
        return
    out = model.generate(ids, 5, temperature=0, use_cache=use_cache, **kw)
    for i, s in enumerate(seqs):
        alone = model.generate(s[None], 5, temperature=0, use_cache=use_cache)
        assert torch.equal(out[i, -5:], alone[0, -5:]), (i, out[i], alone[0])


@pytest.mark.parametrize("mode", ["left", "right"])
@pytest.mark.parametrize("mechanism", attnzoo.list_attentions(causal=True))
def test_generate_prefills_padded_prompts_instead_of_stepping_them(mechanism, mode, monkeypatch):
    model = _lm(mechanism)
    ids, kw, _ = _batch(_seqs(5), mode)
    cls = type(model.blocks[0].attn)
    calls = []
    step = cls.step
    # a counting wrapper with step's own signature: whether step takes attention_mask is read from it (and cached)
    monkeypatch.setattr(
        cls, "step", functools.wraps(step)(lambda self, *a, **k: calls.append(1) or step(self, *a, **k))
    )
    out = model.generate(ids, 4, temperature=0, use_cache=True, **kw)
    prompt = ids.shape[1] if mechanism in REPLAYS_PADDED else 0
    assert len(calls) == (prompt + 3) * len(model.blocks)  # the new tokens only (the last one is not fed)
    monkeypatch.undo()
    assert torch.equal(out, model.generate(ids, 4, temperature=0, use_cache=False, **kw))


def test_step_with_padding_keeps_the_rows_state_and_position():
    model = _lm("linear")
    state = model.init_state(2)
    tok = torch.tensor([3, 4])
    _, state = model.step(tok, state, attention_mask=torch.tensor([1, 0]))
    assert state["pos"].tolist() == [1, 0]
    logits, state = model.step(tok, state)
    alone, _ = model.step(tok[1:], model.init_state(1))
    torch.testing.assert_close(logits[1], alone[0], rtol=1e-12, atol=1e-12)
    zero, _ = model.step(tok, state, attention_mask=torch.tensor([0, 1]))
    assert torch.equal(zero[0], torch.zeros_like(zero[0]))


@pytest.mark.parametrize("pool", ["mean", "cls"])
@pytest.mark.parametrize("mode", ["left", "right", "packed"])
@pytest.mark.parametrize("mechanism", BIDIRECTIONAL)
def test_sequence_classifier_equals_each_sequence_alone(mechanism, mode, pool):
    model = _classifier(mechanism, pool=pool)
    seqs = _seqs(7)
    ids, kw, _ = _batch(seqs, mode, width=10)
    if mode == "packed" and pool == "cls":
        with pytest.raises(ValueError, match="pool='cls'.*packed row"):
            model(ids, **kw)
        return
    if not _masks(model):
        with pytest.raises(ValueError, match=f"attention '{mechanism}' does not honour"):
            model(ids, **kw)
        return
    with torch.no_grad():
        out = model(ids, **kw)
        alone = torch.cat([model(s[None]) for s in seqs])
    assert out.shape == alone.shape
    torch.testing.assert_close(out, alone, rtol=1e-10, atol=1e-10)


def test_dual_classifier_takes_a_mask_per_input():
    model = _classifier(LOCAL, pool="mean", dual=True)
    a, b = _seqs(1), _seqs(2)
    ia, ka, _ = _batch(a, "left", width=10)
    ib, kb, _ = _batch(b, "right", width=9)
    with torch.no_grad():
        out = model(ia, ib, attention_mask=ka["attention_mask"], attention_mask2=kb["attention_mask"])
        alone = torch.cat([model(x[None], y[None]) for x, y in zip(a, b, strict=True)])
    torch.testing.assert_close(out, alone, rtol=1e-10, atol=1e-10)


def test_a_mask_on_an_unmasked_layer_is_an_error_never_ignored():
    model = _lm("softmax")
    for blk in model.blocks:
        blk.attn.supports_masks = False  # as a layer that has not been updated
    ids, kw, _ = _batch(_seqs(), "left")
    with pytest.raises(ValueError, match=r"attention 'softmax' does not honour attention_mask.*supports_masks=False"):
        model(ids, **kw)
    model(ids)  # without a mask it runs as before


# the layers whose prefill declines a padded prompt (MEGA: its chunked attention restarts at fixed offsets)
REPLAYS_PADDED = {"mega"}
# every causal mechanism, Fastmax at both orders (p=1 with the scale that keeps its weights non-negative)
DECODING = [(m, {}) for m in attnzoo.list_attentions(causal=True)] + [("fastmax", {"p": 1, "scale": 0.25})]


def _state_leaves(state) -> dict[str, object]:
    """The leaves of a layer state by name (dict keys or named-tuple fields)."""
    return dict(state.items()) if isinstance(state, dict) else state._asdict()


def _rows(value, batch: int) -> torch.Tensor:
    """An int, per-row ints (``RowInts``) or a tensor as a tensor with a leading batch axis."""
    if isinstance(value, RowInts):
        value = value.values
    return torch.as_tensor(value).expand(batch) if not isinstance(value, torch.Tensor) or value.ndim == 0 else value


@pytest.mark.parametrize("mode", ["none", "left", "right"])
@pytest.mark.parametrize(("mechanism", "options"), DECODING, ids=[f"{m}{o}" for m, o in DECODING])
def test_prefill_state_equals_stepping_the_prompt(mechanism, options, mode):
    model = _lm(mechanism, attention_options=options)
    if mode == "none":
        ids, mask = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(4)), None
    else:
        ids, kw, _ = _batch(_seqs(6), mode)
        mask = kw["attention_mask"].bool()
    b, n = ids.shape
    with torch.no_grad():
        pre = model.prefill(ids, attention_mask=mask)
        if mechanism in REPLAYS_PADDED and mask is not None:
            assert pre is None  # its layer declines a padded prompt: generate() steps through it instead
            return
        logits, state = pre
        full = model(ids) if mask is None else model(ids, attention_mask=mask)
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask
        torch.testing.assert_close(logits[real], full[real], rtol=1e-10, atol=1e-10)
        stepped, last = model.init_state(b), None
        for t in range(n):
            out, stepped = model.step(ids[:, t], stepped, attention_mask=None if mask is None else mask[:, t])
            last = out if last is None else torch.where(real[:, t, None], out, last)  # each row's last real token
        torch.testing.assert_close(_rows(state["pos"], b), _rows(stepped["pos"], b), rtol=0, atol=0)
        for a, c in zip(state["layers"], stepped["layers"], strict=True):
            pairs = zip(_state_leaves(a).items(), _state_leaves(c).values(), strict=True)
            for (name, u), v in pairs:
                if mechanism in GROWING:  # a cache slot per token: the padding slots are never read
                    u, v = u.transpose(1, 2)[real], v.transpose(1, 2)[real]
                torch.testing.assert_close(_rows(u, b), _rows(v, b), rtol=1e-10, atol=1e-10, msg=name)
        has = real.any(dim=1)
        idx_last = (torch.arange(n) * real).argmax(dim=1)
        torch.testing.assert_close(logits[torch.arange(b), idx_last][has], last[has], rtol=1e-10, atol=1e-10)
        # and both decode the same continuation
        g = torch.Generator().manual_seed(7)
        for _ in range(3):
            nxt = torch.randint(0, VOCAB, (b,), generator=g)
            out, state = model.step(nxt, state)
            ref, stepped = model.step(nxt, stepped)
            torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_an_all_ones_mask_runs_on_any_layer():
    model = _lm("tssa")
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=torch.ones_like(ids)), model(ids), rtol=0, atol=0)
