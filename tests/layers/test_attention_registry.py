"""The attention registry: a module of its own that imports nothing from attnzoo, one registration convention for
mechanisms and models, and a mechanism defined outside the package registered at runtime."""

from __future__ import annotations

import pkgutil
import sys
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import attnzoo.layers
import attnzoo.models
import attnzoo.registry as registry_module
from attnzoo._checks import NonFiniteError, check_nonneg_int, check_positive_finite, finite_absmax
from attnzoo.layers import attention_info, build_attention, list_attentions, register_attention, unregister_attention
from attnzoo.layers.base import Attention
from attnzoo.models import create_model
from attnzoo.ops._spec import Backend, Mechanism, Options, option


@pytest.mark.parametrize("package", [attnzoo.layers, attnzoo.models])
def test_importing_a_package_imports_every_public_module_of_it(package):
    # the one convention: a file of attnzoo/layers or attnzoo/models registers itself without being listed
    public = [m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")]
    assert public and [m for m in public if f"{package.__name__}.{m}" not in sys.modules] == []


def test_the_old_homes_of_the_registry_functions_still_work():
    import attnzoo
    import attnzoo.layers.base as base

    for name in ("register_attention", "build_attention", "list_attentions", "attention_info"):
        assert getattr(base, name) is getattr(registry_module, name) is getattr(attnzoo.layers, name)
    assert attnzoo.build_attention is registry_module.build_attention


# --- a mechanism written outside the package, the way its folder would write it ------------------------------------


def toy_op(v: torch.Tensor, *, gain: float = 1.0) -> torch.Tensor:
    """Scale the values (per token: causal as well as bidirectional)."""
    finite_absmax({"v": v}, op="toy_op")
    return v * gain


@dataclass(frozen=True)
class ToyOptions(Options):
    gain: float = option(2.0, check_positive_finite, "scale of the values")
    layer_index: int = option(0, check_nonneg_int, "filled in by the models from the block's index")


TOY = Mechanism(
    op="toy_op",
    options=ToyOptions,
    backends={"naive": Backend(__name__, "toy_op", kind="reference"), "torch": Backend(__name__, "toy_op")},
    causal=True,
)


class ToyAttention(Attention):
    """``proj(gain * v(x))``."""

    mechanism = TOY

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        causal: bool = False,
        gain: float = ToyOptions.gain,
        layer_index: int = ToyOptions.layer_index,
    ) -> None:
        super().__init__(dim, heads, causal=causal, gain=gain, layer_index=layer_index)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        with self.naming_input(x):
            return self.proj(toy_op(self.v(x), gain=self.options.gain))


@pytest.fixture
def toy():
    name = "toy_registry_test"
    assert name not in list_attentions()
    register_attention(name)(ToyAttention)
    yield name
    unregister_attention(name)
    assert name not in list_attentions()


def test_a_mechanism_registered_at_runtime_is_built_by_name(toy):
    assert toy in list_attentions(causal=True) and toy in list_attentions(causal=False)
    assert attention_info(toy) is ToyAttention and ToyAttention.supports_causal
    m = build_attention(toy, 8, 2, causal=True, gain=3.0)
    assert isinstance(m, ToyAttention) and m.options == ToyOptions(gain=3.0) and m.causal
    assert m(torch.randn(2, 5, 8)).shape == (2, 5, 8)
    with pytest.raises(TypeError, match=rf"attention '{toy}' got unknown option\(s\) \['gian'\]; valid options: "):
        build_attention(toy, 8, 2, gian=3.0)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['gian'\]"):
        ToyAttention(8, 2, gian=3.0)
    with pytest.raises(ValueError, match="gain must be a positive finite number, got -1"):
        build_attention(toy, 8, 2, gain=-1)
    with pytest.raises(ValueError, match="already registered to ToyAttention"):
        register_attention(toy)(type("Other", (ToyAttention,), {}))


def test_a_mechanism_registered_at_runtime_names_the_modules_input_in_errors(toy):
    x = torch.randn(2, 5, 8)
    x[1, 3, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"^ToyAttention: x contains non-finite values"):
        build_attention(toy, 8, 2)(x)


def test_a_mechanism_registered_at_runtime_goes_into_the_models(toy):
    model = create_model("gpt2_base", dim=16, depth=2, heads=2, vocab_size=11, block_size=8, attention=toy)
    mixers = [b.attn for b in model.blocks]
    assert all(isinstance(m, ToyAttention) and m.causal for m in mixers)
    assert [m.options.layer_index for m in mixers] == [0, 1]  # the models fill in the options the spec declares
    assert model(torch.randint(0, 11, (2, 8))).shape == (2, 8, 11)


def test_each_layer_has_a_forward_code_object_of_its_own():
    # torch.compile counts recompiles per code object: the q/k/v layers share QKVProjection's forward, each as a copy
    # (one code object shared by four layers reaches the limit of 8 with their float32 and float64 forms)
    from attnzoo.layers.base import QKVProjection

    classes = [attention_info(n) for n in list_attentions()]
    shared = [c for c in classes if issubclass(c, QKVProjection)]
    assert len(shared) >= 4
    codes = [c.forward.__code__ for c in classes]
    assert len({id(code) for code in codes}) == len(codes), [c.__name__ for c in classes]
    assert all(c.forward.__qualname__ == f"{c.__qualname__}.forward" for c in shared)
