"""The contract's comparisons catch a wrong backend: each registered backend, wrapped so that its output is wrong,
fails them.

For every backend the contract runs (read from the registry as there), a copy of its output is made wrong in one
element (scaled and shifted, so the value and its gradient both move): the forward and backward comparison with the
reference fails, and so does decoding against it where the op has a step; a backend whose output at every token
takes in the mean over all tokens fails the causal leak check; a layer's backend that is wrong only when it gets a
mask fails the padded and packed checks, and one wrong only at a position past 256 tokens fails the long ones; a
layer's ``step`` off by a little fails decoding. Small shapes: this is a test of the tests.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from contract_checks import (
    assert_layer_matches_reference,
    backends,
    build,
    configs,
    device_of,
    long_mask_backends,
    long_mask_error,
    op_cases,
    option_sets,
    shapes,
    tokens,
)

from attnzoo import selftest
from attnzoo.layers import attention_info, list_attentions
from attnzoo.ops._dispatch import force_backend
from attnzoo.ops._spec import Mechanism

F64 = torch.float64


def _wrong(out: torch.Tensor) -> torch.Tensor:
    # one element of a copy scaled by 1.01 and shifted by 0.01: its value and the gradient through it move
    bump = torch.zeros_like(out).flatten()
    bump[0] = 0.01
    bump = bump.view_as(out)
    return out * (1 + bump) + bump


def _leaky(out: torch.Tensor) -> torch.Tensor:
    # every output takes in the mean over all tokens: later tokens reach earlier outputs
    return out + 1e-3 * out.mean()


def _planted(mech: Mechanism, name: str, bug, monkeypatch, *, only_masked: bool = False) -> None:
    """Replace backend ``name`` of ``mech`` by one whose output (the first tensor it returns) goes through ``bug``."""
    b = mech.backends[name]
    fn = b.load()

    @functools.wraps(fn)
    def planted(*args, **kwargs):
        out = fn(*args, **kwargs)
        # a mechanism whose Mechanism.mask_options miss the keyword it passes masks under is never planted here
        if only_masked and not mech.masked(kwargs):
            return out
        if isinstance(out, tuple):
            return (bug(out[0]), *out[1:])
        return bug(out)

    monkeypatch.setitem(mech.backends, name, dataclasses.replace(b, fn=planted, attr=b.attr))


def _smallest(case, backend: str, *, causal: bool | None = None, min_n: int = 1):
    # the smallest shape with a config (of the given form) and at least min_n tokens
    for shape in sorted(shapes(case, backend), key=math.prod):
        cfgs = configs(case, shape, causal=causal)
        if cfgs and (len(shape) != 4 or shape[2] >= min_n):
            return shape, cfgs[0]
    raise AssertionError(f"{case.name}: no shape for the planted check (causal={causal})")


@pytest.mark.parametrize("case,backend", op_cases())
def test_a_wrong_backend_fails_the_reference_comparison(case, backend, monkeypatch):
    shape, cfg = _smallest(case, backend, min_n=2)
    device = device_of(case.mechanism.backends[backend])
    fwd, bwd = selftest.forward_backward_errors(case, cfg, shape, F64, device, backend)
    assert fwd <= selftest.TOLERANCES[("forward", F64)] and bwd <= selftest.TOLERANCES[("backward", F64)]
    _planted(case.mechanism, backend, _wrong, monkeypatch)
    fwd, bwd = selftest.forward_backward_errors(case, cfg, shape, F64, device, backend)
    assert fwd > selftest.TOLERANCES[("forward", F64)], fwd
    assert bwd > selftest.TOLERANCES[("backward", F64)], bwd
    if case.step is not None:
        shape, cfg = _smallest(case, backend, causal=True)
        assert selftest.decode_error(case, cfg, shape, F64, device, backend) > selftest.TOLERANCES[("decode", F64)]


@pytest.mark.parametrize(
    "case,backend", [c for c in op_cases() if any(x.get("causal") for x in c.values[0].configs(False))]
)
def test_a_backend_reading_later_tokens_fails_the_leak_check(case, backend, monkeypatch):
    shape, cfg = _smallest(case, backend, causal=True, min_n=2)
    device = device_of(case.mechanism.backends[backend])
    assert selftest.leak_error(case, cfg, shape, F64, device, backend) <= selftest.TOLERANCES[("causal leak", F64)]
    _planted(case.mechanism, backend, _leaky, monkeypatch)
    assert selftest.leak_error(case, cfg, shape, F64, device, backend) > selftest.TOLERANCES[("causal leak", F64)]


def _masked_defaults() -> list:
    return [
        pytest.param(name, b, id=f"{name}-{b}")
        for name in list_attentions()
        if getattr(attention_info(name), "supports_masks", False)
        for b in [attention_info(name).mechanism.reference] + backends(attention_info(name).mechanism, masks=True)
    ]


@pytest.mark.parametrize("name,backend", _masked_defaults())
def test_a_backend_wrong_under_a_mask_fails_the_equal_to_alone_check(name, backend, monkeypatch):
    m = build(name, {}, causal=False if attention_info(name).mechanism.noncausal else True)
    device = device_of(m.mechanism.backends[backend])
    m = m.to(device)
    xs = [tokens(n, seed=n, batch=1).to(device) for n in (2, 1)]
    tol = selftest.TOLERANCES[("mask", F64)]
    with force_backend(backend):
        assert selftest.mask_error(m, xs, "varlen", torch.Generator().manual_seed(0)) <= tol
    _planted(m.mechanism, backend, _wrong, monkeypatch, only_masked=True)
    for mode in ("mask", "varlen"):
        with force_backend(backend):
            assert selftest.mask_error(m, xs, mode, torch.Generator().manual_seed(0)) > tol, mode


def _wrong_past_256(out: torch.Tensor) -> torch.Tensor:
    # _wrong at token position 260 only (the first axis after the batch longer than 256): a short call is untouched
    axis = next((d for d in range(1, out.dim()) if out.shape[d] > 256), None)
    if axis is None:
        return out
    bump = torch.zeros_like(out)
    bump[(0,) * axis + (260,)] = 0.01
    return out * (1 + bump) + bump


@pytest.mark.parametrize("name,backend", long_mask_backends())
def test_a_backend_wrong_under_a_mask_past_256_tokens_fails_the_long_check(name, backend, monkeypatch):
    m = build(name, {}, causal=False if attention_info(name).mechanism.noncausal else True)
    _planted(m.mechanism, backend, _wrong_past_256, monkeypatch, only_masked=True)
    device = device_of(m.mechanism.backends[backend])
    short = [tokens(n, seed=n, batch=1).to(device) for n in (13, 5)]
    with force_backend(backend):  # the short checks cannot see it
        assert selftest.mask_error(m.to(device), short, "varlen", torch.Generator().manual_seed(0)) <= 1e-9
    for mode in ("mask", "varlen"):
        assert long_mask_error(m, backend, mode, torch.Generator().manual_seed(0)) > selftest.TOLERANCES[(mode, F64)]


def _layer_defaults() -> list:
    return [
        pytest.param(c.values[0], b, id=f"{c.values[0]}-{b}")
        for c in option_sets()
        if not c.values[1]
        for b in backends(attention_info(c.values[0]).mechanism)
    ]


@pytest.mark.parametrize("name,backend", _layer_defaults())
def test_a_wrong_backend_fails_the_layer_comparison(name, backend, monkeypatch):
    m = build(name, {}, causal=False if attention_info(name).mechanism.noncausal else True)
    assert_layer_matches_reference(m, backend)
    _planted(m.mechanism, backend, _wrong, monkeypatch)
    with pytest.raises(AssertionError):
        assert_layer_matches_reference(m, backend)


@pytest.mark.parametrize(
    "name", [n for n in list_attentions(causal=True) if getattr(attention_info(n), "supports_step", False)]
)
def test_a_wrong_step_fails_the_layer_decoding_check(name, monkeypatch):
    m = build(name, {}, causal=True)
    x = tokens(5)
    assert selftest.layer_decode_error(m, x) <= selftest.TOLERANCES[("decode", F64)]
    step = m.step

    def wrong_step(x_t, state):
        y, state = step(x_t, state)
        return _wrong(y), state

    monkeypatch.setattr(m, "step", wrong_step)
    assert selftest.layer_decode_error(m, x) > selftest.TOLERANCES[("decode", F64)]
