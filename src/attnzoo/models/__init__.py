"""attnzoo models: one transformer skeleton, the papers' architectures and sizes, safe checkpoints.

- ``create_model(name, **overrides)`` / ``list_models(pattern)`` / ``register_model``: timm-style registry of
  the papers' configurations (``attention=`` swaps the mechanism of any model where it is valid).
- Adding an architecture: a model file with a config class (``ModelConfig`` subclass with an ``arch`` tag)
  and ``@register_architecture`` above the model class; named sizes go in ``zoo.py``. Nothing lists the file:
  importing this package imports every public module of it, as ``attnzoo.layers`` does for the mechanisms
  (:func:`attnzoo.registry.import_submodules`).
- ``from_pretrained(dir)`` / ``model.save_pretrained(dir)``: ``config.json`` + ``model.safetensors``.
- ``count_parameters(name)``: parameter count on the meta device (no allocation).
- Config dataclasses: :class:`VisionConfig`, :class:`CausalLMConfig`, :class:`SequenceClassifierConfig`,
  :class:`ICLConfig`.
"""

from attnzoo.models.blocks import ISTA, Block, LayerScale, Mlp
from attnzoo.models.checkpoint import CheckpointError, PretrainedModel, from_pretrained, save_pretrained
from attnzoo.models.class_attention import ClassAttention, ClassAttentionBlock
from attnzoo.models.config import (
    BackboneConfig,
    CausalLMConfig,
    ICLConfig,
    ModelConfig,
    SequenceClassifierConfig,
    VisionConfig,
)
from attnzoo.models.icl import ICLRegressor
from attnzoo.models.language import CausalLM
from attnzoo.models.registry import (
    ModelEntry,
    build_model,
    count_parameters,
    create_model,
    get_config,
    list_models,
    model_entry,
    paper_comparable_count,
    register_architecture,
    register_model,
)
from attnzoo.models.sequence import SequenceClassifier
from attnzoo.models.vision import VisionTransformer
from attnzoo.registry import import_submodules

# Importing a model file registers its class with @register_architecture (the registry derives arch -> model
# class -> config class from those registrations), importing zoo the papers' named configurations.
import_submodules(__name__, __path__)

__all__ = [
    "BackboneConfig",
    "Block",
    "CausalLM",
    "CausalLMConfig",
    "CheckpointError",
    "ClassAttention",
    "ClassAttentionBlock",
    "ICLConfig",
    "ICLRegressor",
    "ISTA",
    "LayerScale",
    "Mlp",
    "ModelConfig",
    "ModelEntry",
    "PretrainedModel",
    "SequenceClassifier",
    "SequenceClassifierConfig",
    "VisionConfig",
    "VisionTransformer",
    "build_model",
    "count_parameters",
    "create_model",
    "from_pretrained",
    "get_config",
    "list_models",
    "model_entry",
    "paper_comparable_count",
    "register_architecture",
    "register_model",
    "save_pretrained",
]
