"""The contract every registered mechanism keeps, read from its spec (``layer.mechanism``): no test file per mechanism.

For each name of ``list_attentions()`` and each option set (the defaults and the spec's ``examples``): output shape
and dtype; forward and gradients equal to the op's reference backend (``naive.py``, forced through
``force_backend``); every parameter and the input receive gradients; a causal module reads no future token; token by
token decoding equals the causal forward (mechanisms with a recurrent state); bad options and bad decoding inputs
raise naming the culprit. A new mechanism is covered as soon as its layer registers.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import attnzoo
from attnzoo._checks import NonFiniteError
from attnzoo.layers import attention_info, build_attention, list_attentions
from attnzoo.layers.base import Attention
from attnzoo.ops._dispatch import force_backend
from attnzoo.ops._spec import CheckCase, Mechanism, Options

DIM, HEADS, N = 12, 3, 9


def _cases(causal: bool | None = None) -> list:
    out = []
    for name in list_attentions(causal=causal):
        spec = attention_info(name).mechanism
        for i, opts in enumerate(({},) + tuple(spec.examples)):
            if causal and spec.options.build(name, **opts).causal_error() is not None:
                continue  # no causal form with these options: test_options_without_a_causal_form_refuse_it
            out.append(pytest.param(name, opts, id=f"{name}-{i}"))
    return out


def _modes(name: str, opts: dict | None = None) -> list[bool]:
    # an option set may lack the mechanism's causal form (Options.causal_error): bidirectional only, and refused
    spec = attention_info(name).mechanism
    causal = spec.causal and spec.options.build(name, **(opts or {})).causal_error() is None
    return [c for c, ok in ((False, spec.noncausal), (True, causal)) if ok]


def _build(name: str, opts: dict, *, causal: bool, dtype=torch.float64, seed: int = 0) -> Attention:
    torch.manual_seed(seed)
    m = build_attention(name, DIM, HEADS, causal=causal, **opts).to(dtype).eval()
    with torch.no_grad():  # away from the init (zero biases, unit temperatures), which can hide a wrong term
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return m


def _x(n: int = N, dtype=torch.float64, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, n, DIM, dtype=dtype, generator=torch.Generator().manual_seed(seed))


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
    for causal in _modes(name):
        m = _build(name, {}, causal=causal)
        x = _x()
        x[0, 2, 1] = float("nan")
        with pytest.raises(NonFiniteError, match=rf"^{type(m).__name__}: x contains non-finite values") as info:
            m(x)
        assert info.value.module == type(m).__name__


# ------------------------------------------------------------------------------------------------ forward


def _shape_cases() -> list:
    # one token with the defaults; the examples are option sets for N tokens (CSP's groups divide N, say)
    return [pytest.param(*c.values, n, id=f"{c.id}-n{n}") for c in _cases() for n in ((N,) if c.values[1] else (1, N))]


@pytest.mark.parametrize("name,opts,n", _shape_cases())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shape_and_dtype(name, opts, n, dtype):
    for causal in _modes(name, opts):
        m = _build(name, opts, causal=causal, dtype=dtype)
        y = m(_x(n, dtype))
        assert y.shape == (2, n, DIM) and y.dtype == dtype
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("name,opts", _cases())
def test_forward_and_gradients_equal_the_reference(name, opts):
    for causal in _modes(name, opts):
        m = _build(name, opts, causal=causal)
        params = dict(m.named_parameters())
        results = []
        for backend in (None, m.mechanism.reference):
            x = _x().requires_grad_()
            with force_backend(backend) if backend else _nothing():
                y = m(x)
                grads = torch.autograd.grad(y.square().sum(), [x, *params.values()])
            results.append((y, grads))
        (y, grads), (y_ref, grads_ref) = results
        torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
        for label, g, r in zip(["x", *params], grads, grads_ref, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-10, msg=lambda s, label=label: f"{label}: {s}")
            # every parameter and the input take part (a term that is dropped shows as a zero gradient)
            assert torch.isfinite(g).all() and g.abs().sum() > 0, (name, causal, label)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------------------------ causality


@pytest.mark.parametrize("name,opts", _cases(causal=True))
@pytest.mark.parametrize("t", [0, 4, 7])
def test_causal_module_reads_no_future_token(name, opts, t):
    m = _build(name, opts, causal=True)
    x = _x()
    x2 = x.clone()
    x2[:, t + 1 :] += torch.randn_like(x2[:, t + 1 :])
    y, y2 = m(x), m(x2)
    torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=0)  # not one bit moves
    assert not torch.allclose(y2[:, t + 1 :], y[:, t + 1 :])


@pytest.mark.parametrize("name,opts", [c for c in _cases() if c.values[0] in list_attentions(causal=True)])
def test_options_without_a_causal_form_refuse_it(name, opts):
    why = attention_info(name).mechanism.options.build(name, **opts).causal_error()
    if why is None:
        assert _build(name, opts, causal=True).causal
        return
    assert _modes(name, opts) == [False] and isinstance(why, str) and why
    with pytest.raises(ValueError, match=rf"^attention '{name}': " + re.escape(why)):
        build_attention(name, DIM, HEADS, causal=True, **opts)


@pytest.mark.parametrize("name", [n for n in list_attentions() if not attention_info(n).mechanism.causal])
def test_bidirectional_only_mechanisms_refuse_causal(name):
    with pytest.raises(ValueError, match=rf"attention '{name}' has no causal mode; causal mechanisms are"):
        build_attention(name, DIM, HEADS, causal=True)


# ------------------------------------------------------------------------------------------------ decoding


def _decoders() -> list:
    return [c for c in _cases(causal=True) if getattr(attention_info(c.values[0]), "supports_step", False)]


@pytest.mark.parametrize("name,opts", _decoders())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decoding_equals_the_causal_forward(name, opts, dtype):
    m = _build(name, opts, causal=True, dtype=dtype)
    x = _x(dtype=dtype)
    full = m(x)
    state = m.init_state(2)
    assert isinstance(state, m.mechanism.state)
    outs = []
    for t in range(N):
        y, state = m.step(x[:, t : t + 1], state)
        assert y.shape == (2, 1, DIM) and y.dtype == dtype
        outs.append(y)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", [c.values[0] for c in _decoders() if not c.values[1]])
def test_decoding_refuses_bad_input(name):
    m = _build(name, {}, causal=True)
    with pytest.raises(ValueError, match=r"\(B, 1, dim\)"):
        m.step(_x(2), m.init_state(2))
    bidirectional = _build(name, {}, causal=False)
    with pytest.raises(ValueError, match="causal=True"):
        bidirectional.step(_x(1), m.init_state(2))


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
