"""The contract every registered layer keeps, read from its spec (``layer.mechanism``): no test file per mechanism.

For each name of ``list_attentions()`` and each option set (the defaults and the spec's ``examples``): output shape
and dtype; forward and gradients under each backend of its op equal those under the op's reference (``naive.py``,
both forced through ``force_backend``), and every parameter and the input receive gradients; a causal module reads no
future token; token by token decoding equals the causal forward (layers with a recurrent state); a padded batch and a
packed row equal each sequence alone, per backend that takes masks, with short sequences and with one past 256
tokens; bad options and bad decoding inputs raise naming
the culprit. A new mechanism is covered as soon as its layer registers.
"""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest
import torch
from contract_checks import (
    DIM,
    HEADS,
    assert_layer_matches_reference,
    backends,
    build,
    device_of,
    long_mask_backends,
    long_mask_error,
    modes,
    option_sets,
    runs_here,
    tokens,
)

import attnzoo
from attnzoo import selftest
from attnzoo._checks import NonFiniteError
from attnzoo.layers import attention_info, build_attention, list_attentions
from attnzoo.layers.base import capture_internals
from attnzoo.ops._dispatch import force_backend
from attnzoo.ops._spec import CheckCase, Mechanism, Options

N = 9


# ------------------------------------------------------------------------------------------------ the spec


@pytest.mark.parametrize("name", list_attentions())
def test_every_mechanism_is_described_by_a_spec(name):
    cls = attention_info(name)
    spec = cls.mechanism
    assert isinstance(spec, Mechanism) and issubclass(spec.options, Options)
    assert spec.reference in spec.backends and spec.default in spec.backends
    assert spec.backends[spec.reference].kind == "reference"
    assert (cls.supports_causal, cls.supports_noncausal) == (spec.causal, spec.noncausal)
    assert name in list_attentions(causal=True) if spec.causal else name not in list_attentions(causal=True)
    for opts in spec.examples:  # the examples are valid option sets
        spec.options(**opts)
    # the constructor's signature is the options dataclass (what models and the HF swap introspect)
    import inspect

    params = list(inspect.signature(cls.__init__).parameters)
    assert params == ["self", "dim", "heads", "causal", *spec.options.names()]
    m = build_attention(name, DIM, HEADS)
    assert m.options == spec.options()  # the defaults, checked once, kept on the module


@pytest.mark.parametrize("name", list_attentions())
def test_every_mechanism_declares_selftest_cases_that_run(name):
    # `attnzoo selftest` reads them from the spec (Mechanism.checks): each makes inputs the reference op accepts
    cases = attention_info(name).mechanism.check_cases()
    assert cases and all(isinstance(c, CheckCase) and isinstance(c.mechanism, Mechanism) for c in cases)
    for case in cases:
        made: set[str] = set()  # an input may belong to some configs only (TSSA's causal bias, CBSA's reps)
        for cfg in case.configs(True):
            x = case.make(case.shapes(True)[0], cfg, torch.Generator().manual_seed(0))
            made |= set(x)
            out = case.call(x, cfg, case.mechanism.reference)
            assert out.dtype == torch.float64 and torch.isfinite(out).all(), (case.name, cfg)
        assert set(case.grads) | set(case.tokens) <= made, case.name


@pytest.mark.parametrize("name", list_attentions())
def test_the_constructor_defaults_are_the_options_defaults(name):
    # the constructor states its options explicitly, with the defaults of the spec's dataclass (stated once there)
    import inspect

    cls = attention_info(name)
    params = inspect.signature(cls.__init__).parameters
    assert {f.name: params[f.name].default for f in dataclasses.fields(cls.mechanism.options)} == {
        f.name: f.default for f in dataclasses.fields(cls.mechanism.options)
    }
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in ["causal", *cls.mechanism.options.names()])


@pytest.mark.parametrize("name", list_attentions())
def test_nan_in_the_input_is_reported_for_the_modules_input(name):
    # the op finds it in its projected tensors; the module restates it for x, the tensor the caller passed
    for causal in modes(name):
        m = build(name, {}, causal=causal)
        x = tokens(N)
        x[0, 2, 1] = float("nan")
        with pytest.raises(NonFiniteError, match=rf"^{type(m).__name__}: x contains non-finite values") as info:
            m(x)
        assert info.value.module == type(m).__name__


# ------------------------------------------------------------------------------------------------ forward


def _shape_cases() -> list:
    # one token with the defaults; the examples are option sets for N tokens (CSP's groups divide N, say)
    return [
        pytest.param(*c.values, n, id=f"{c.id}-n{n}") for c in option_sets() for n in ((N,) if c.values[1] else (1, N))
    ]


@pytest.mark.parametrize("name,opts,n", _shape_cases())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shape_and_dtype(name, opts, n, dtype):
    for causal in modes(name, opts):
        m = build(name, opts, causal=causal, dtype=dtype)
        y = m(tokens(n, dtype))
        assert y.shape == (2, n, DIM) and y.dtype == dtype
        assert torch.isfinite(y).all()


def _layer_backends() -> list:
    # every option set under every backend of its op that runs here (the reference is what they are compared with)
    return [
        pytest.param(*c.values, b, id=f"{c.id}-{b}")
        for c in option_sets()
        for b in backends(attention_info(c.values[0]).mechanism)
    ]


@pytest.mark.parametrize("name,opts,backend", _layer_backends())
def test_forward_and_gradients_equal_the_reference(name, opts, backend):
    for causal in modes(name, opts):
        assert_layer_matches_reference(build(name, opts, causal=causal), backend)


# ------------------------------------------------------------------------------------------------ causality


@pytest.mark.parametrize("name,opts", option_sets(causal=True))
@pytest.mark.parametrize("t", [0, 4, 7])
def test_causal_module_reads_no_future_token(name, opts, t):
    m = build(name, opts, causal=True)
    x = tokens(N)
    x2 = x.clone()
    x2[:, t + 1 :] += torch.randn_like(x2[:, t + 1 :])
    y, y2 = m(x), m(x2)
    torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=0)  # not one bit moves
    assert not torch.allclose(y2[:, t + 1 :], y[:, t + 1 :])


@pytest.mark.parametrize("name,opts", [c for c in option_sets() if c.values[0] in list_attentions(causal=True)])
def test_options_without_a_causal_form_refuse_it(name, opts):
    why = attention_info(name).mechanism.options.build(name, **opts).causal_error()
    if why is None:
        assert build(name, opts, causal=True).causal
        return
    assert modes(name, opts) == [False] and isinstance(why, str) and why
    with pytest.raises(ValueError, match=rf"^attention '{name}': " + re.escape(why)):
        build_attention(name, DIM, HEADS, causal=True, **opts)


@pytest.mark.parametrize("name", [n for n in list_attentions() if not attention_info(n).mechanism.causal])
def test_bidirectional_only_mechanisms_refuse_causal(name):
    with pytest.raises(ValueError, match=rf"attention '{name}' has no causal mode; causal mechanisms are"):
        build_attention(name, DIM, HEADS, causal=True)


# ------------------------------------------------------------------------------------------------ decoding


def _decoders() -> list:
    return [c for c in option_sets(causal=True) if getattr(attention_info(c.values[0]), "supports_step", False)]


@pytest.mark.parametrize("name,opts", _decoders())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decoding_equals_the_causal_forward(name, opts, dtype):
    m = build(name, opts, causal=True, dtype=dtype)
    x = tokens(N, dtype=dtype)
    state = m.init_state(2)
    assert isinstance(state, m.mechanism.state)
    y, _ = m.step(x[:, :1], state)
    assert y.shape == (2, 1, DIM) and y.dtype == dtype
    err = selftest.layer_decode_error(m, x)
    assert err <= selftest.TOLERANCES[("decode", dtype)], err


@pytest.mark.parametrize("name", [c.values[0] for c in _decoders() if not c.values[1]])
def test_decoding_refuses_bad_input(name):
    m = build(name, {}, causal=True)
    with pytest.raises(ValueError, match=r"\(B, 1, dim\)"):
        m.step(tokens(2), m.init_state(2))
    bidirectional = build(name, {}, causal=False)
    with pytest.raises(ValueError, match="causal=True"):
        bidirectional.step(tokens(1), m.init_state(2))


# ------------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize("name", list_attentions())
def test_unknown_option_lists_the_valid_ones(name):
    valid = attention_info(name).mechanism.options.names()
    with pytest.raises(
        TypeError,
        match=rf"attention '{name}' got unknown option\(s\) \['bogus'\]; valid options: "
        + rf"{list(valid)!r}".replace("[", r"\[").replace("]", r"\]"),
    ):
        build_attention(name, DIM, HEADS, bogus=1)
    with pytest.raises(TypeError, match="unknown option"):
        attention_info(name)(DIM, HEADS, bogus=1)  # the class itself checks, not only build_attention


@pytest.mark.parametrize("name", list_attentions())
def test_every_option_is_checked_when_the_module_is_built(name):
    # a value of the wrong kind for any option fails at construction, naming the option (not at the first forward)
    for f in dataclasses.fields(attention_info(name).mechanism.options):
        with pytest.raises((TypeError, ValueError), match=f.name):
            build_attention(name, DIM, HEADS, **{f.name: object()})


def test_build_attention_refuses_unknown_names_and_bad_sizes():
    with pytest.raises(ValueError, match=r"unknown attention 'nope'; valid names: \["):
        build_attention("nope", DIM, HEADS)
    with pytest.raises(ValueError, match="divisible by heads=5"):
        build_attention(list_attentions()[0], DIM, 5)
    assert attnzoo.list_attentions() == list_attentions()


# ------------------------------------------------------------------------------------------------ masks


def _masked_layers() -> list:
    # every option set of a layer that honours attention_mask / cu_seqlens, under each backend taking masks
    return [
        pytest.param(*c.values, b, id=f"{c.id}-{b}")
        for c in option_sets()
        if getattr(attention_info(c.values[0]), "supports_masks", False)
        for b in [attention_info(c.values[0]).mechanism.reference]
        + backends(attention_info(c.values[0]).mechanism, masks=True)
    ]


#: the defaults: odd lengths, one of a single token, long enough to cross a chunk of the chunked causal forms; the
#: spec's examples are option sets for up to N = 9 tokens (a position table of 9, groups dividing 9, chunks of 3-5)
MASK_LENGTHS = {"defaults": [13, 5, 1, 20], "examples": [9, 3, 6]}


@pytest.mark.parametrize("mode", ["mask", "varlen"])
@pytest.mark.parametrize("name,opts,backend", _masked_layers())
def test_padded_and_packed_rows_equal_each_sequence_alone(name, opts, backend, mode):
    # left- and right-padded rows (mask) or one packed row (varlen) against each sequence alone, outputs and input
    # gradients; padding gets zero output and zero gradient
    gen = torch.Generator().manual_seed(2)
    for causal in modes(name, opts):
        m = build(name, opts, causal=causal)
        device = device_of(m.mechanism.backends[backend])
        lengths = MASK_LENGTHS["examples" if opts else "defaults"]
        if m.mechanism.backends[backend].kind == "triton":
            lengths = sorted(lengths)[:2]  # the interpreter runs every program in Python: the two shortest
        xs = [tokens(n, seed=3 + n, batch=1).to(device) for n in lengths]
        with force_backend(backend):
            err = selftest.mask_error(m.to(device), xs, mode, gen)
        assert err <= selftest.TOLERANCES[(mode, torch.float64)], (causal, err)


@pytest.mark.parametrize("mode", ["mask", "varlen"])
@pytest.mark.parametrize("name,backend", long_mask_backends())
def test_long_padded_and_packed_rows_equal_each_sequence_alone(name, backend, mode):
    # sequences of 300 and 77 tokens: masking past the first 256 positions, where chunks and blocks change size
    gen = torch.Generator().manual_seed(4)
    for causal in modes(name):
        err = long_mask_error(build(name, {}, causal=causal), backend, mode, gen)
        assert err <= selftest.TOLERANCES[(mode, torch.float64)], (causal, err)


@pytest.mark.parametrize(
    "name,opts", [c for c in option_sets() if getattr(attention_info(c.values[0]), "supports_masks", False)]
)
def test_capture_with_a_mask_records_what_the_forward_computes(name, opts):
    # capture changes nothing of the output; a recorded token map (B, H, N, N) gives padding no weight, a channel
    # map (B, H, P, P) is the map of the row's real tokens alone
    for causal in modes(name, opts):
        m = build(name, opts, causal=causal)
        x = tokens(N)
        # six real tokens a row (the examples' groups divide it), left- and right-padded
        mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0, 0]])
        plain = m(x, attention_mask=mask)
        with capture_internals(m) as rec:
            captured = m(x, attention_mask=mask)
        torch.testing.assert_close(captured, plain, rtol=1e-10, atol=1e-11)
        for r in rec.values():
            attn = r.get("attn")
            if attn is None or attn.ndim != 4:
                continue
            if attn.shape[-2:] == (N, N):
                assert bool((attn[0, :, :3] == 0).all()) and bool((attn[0, :, :, :3] == 0).all())
                assert bool((attn[1, :, 6:] == 0).all()) and bool((attn[1, :, :, 6:] == 0).all())
            else:
                with capture_internals(m) as alone:
                    m(x[:1, 3:])
                (want,) = (a["attn"] for a in alone.values() if "attn" in a)
                torch.testing.assert_close(attn[:1], want, rtol=1e-10, atol=1e-11)


# ------------------------------------------------------------------------------------------------ the call path


def _cpu_backends() -> list:
    return [
        pytest.param(name, b, id=f"{name}-{b}")
        for name in list_attentions()
        for b, spec in attention_info(name).mechanism.backends.items()
        if spec.kind != "triton" and runs_here(spec)
    ]


@pytest.mark.parametrize("name,backend", _cpu_backends())
def test_no_module_is_imported_by_name_from_build_attention_to_the_kernel(name, backend, monkeypatch):
    # build_attention -> layer -> op -> backend -> kernel are direct references: only an optional kernel (Triton)
    # may be imported by its module's name, when it first runs
    import_module = importlib.import_module

    def by_name(module, *args, **kwargs):
        # third-party libraries import by name as they like (the kernels' first build does)
        if module.startswith("attnzoo"):
            raise AssertionError(f"importlib.import_module({module!r}) on the way from build_attention to {backend!r}")
        return import_module(module, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", by_name)
    for causal in modes(name):
        m = build(name, {}, causal=causal)
        x = tokens(N).requires_grad_()
        with force_backend(backend):
            m(x).sum().backward()
        assert x.grad is not None
