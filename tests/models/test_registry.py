"""The registry (timm's pattern): it imports nothing from attnzoo, and an architecture is one model file."""

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import nn

import attnzoo.models._registry as registry_module
from attnzoo.models import (
    PretrainedModel,
    build_model,
    count_parameters,
    create_model,
    from_pretrained,
    get_config,
    list_models,
    register_architecture,
    register_model,
)
from attnzoo.models.config import ModelConfig, config_class_for
from attnzoo.models.registry import model_class_for, unregister_architecture, unregister_model


def test_every_builtin_architecture_is_registered_once_with_its_config_class():
    archs = {get_config(name).arch for name in list_models()}
    assert archs == set(registry_module.list_architectures())
    for arch in archs:
        cls = model_class_for(arch)
        assert config_class_for(arch) is cls.config_class and cls.config_class.arch == arch


# --- a new architecture, written the way a model file would write it -----------------------------------


@dataclass
class ToyConfig(ModelConfig):
    arch: ClassVar[str] = "toy_registry_test"

    dim: int = 4
    num_classes: int = 3


class ToyModel(PretrainedModel):
    """``(B, dim)`` -> ``(B, num_classes)``: one linear layer."""

    config_class = ToyConfig

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.head = nn.Linear(config.dim, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


@pytest.fixture
def toy_registered():
    """ToyModel registered as its model file would (class decorator + a named size), removed afterwards."""
    register_architecture(ToyModel)
    register_model("toy_registry_test_small", paper="none (test)")(lambda: ToyConfig(dim=4, num_classes=3))
    try:
        yield
    finally:
        unregister_model("toy_registry_test_small")
        unregister_architecture(ToyConfig.arch)


def test_a_new_architecture_needs_only_its_registration(toy_registered, tmp_path):
    assert "toy_registry_test_small" in list_models("toy_*")
    cfg = get_config("toy_registry_test_small", dim=6)
    assert cfg == ToyConfig(dim=6, num_classes=3)
    model = build_model(cfg)
    assert type(model) is ToyModel and model(torch.randn(2, 6)).shape == (2, 3)
    assert type(create_model("toy_registry_test_small", num_classes=5)) is ToyModel
    assert count_parameters("toy_registry_test_small") == 4 * 3 + 3
    # checkpoints find the class through the registry too
    loaded = from_pretrained(model.save_pretrained(tmp_path / "toy"))
    assert type(loaded) is ToyModel and torch.equal(loaded.head.weight, model.head.weight)


def test_unregistering_removes_the_architecture(toy_registered):
    unregister_model("toy_registry_test_small")
    unregister_architecture(ToyConfig.arch)
    assert list_models("toy_*") == []
    with pytest.raises(ValueError, match="unknown model arch 'toy_registry_test'; valid archs: \\["):
        build_model(ToyConfig())


def test_registering_a_second_class_for_an_architecture_fails(toy_registered):
    class OtherToy(ToyModel):
        pass

    with pytest.raises(ValueError, match="architecture 'toy_registry_test' is already registered"):
        register_architecture(OtherToy)
    assert register_architecture(ToyModel) is ToyModel  # registering the same class again is a no-op


def test_a_model_class_without_an_arch_tag_is_refused():
    class NoArch(nn.Module):
        pass

    with pytest.raises(TypeError, match="config_class must be a config class with a non-empty 'arch' tag"):
        register_architecture(NoArch)
