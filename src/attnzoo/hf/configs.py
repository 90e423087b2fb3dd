"""``transformers`` configs of attnzoo's two model families: causal LMs and vision classifiers.

Each config declares the fields of the attnzoo dataclass it mirrors (:class:`attnzoo.models.config.
CausalLMConfig` / :class:`~attnzoo.models.config.VisionConfig`), read from that dataclass, under the same names, so
``attention`` (the mechanism) and ``attention_options`` are plain config fields; the standard ``transformers`` names
(``hidden_size``, ``num_hidden_layers``, ...) are aliases. Values are validated when the config is built
by building the attnzoo config, so a bad value fails with attnzoo's message naming it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import field
from pathlib import Path
from typing import Any, ClassVar

from transformers import PretrainedConfig

from attnzoo.models.config import CausalLMConfig, ModelConfig, VisionConfig

__all__ = ["AttnZooCausalLMConfig", "AttnZooVisionConfig", "attnzoo_fields"]


def attnzoo_fields(cls: type[ModelConfig]) -> list[str]:
    """Field names of an attnzoo config dataclass."""
    return [f.name for f in dataclasses.fields(cls)]


#: the module ``auto_map`` names, written beside ``config.json`` (see ``save_pretrained``)
LOADER_MODULE = "attnzoo_hf"
_LOADER_SOURCE = (
    "# Written by attnzoo: lets transformers' Auto classes load this model (trust_remote_code=True) by importing\n"
    "# the installed attnzoo (pip install 'attnzoo[hf]'). Equivalent to `import attnzoo.hf` before loading.\n"
    "from attnzoo.hf import (  # noqa: F401\n"
    "    AttnZooCausalLMConfig,\n"
    "    AttnZooForCausalLM,\n"
    "    AttnZooForImageClassification,\n"
    "    AttnZooVisionConfig,\n"
    ")\n"
)


class _AttnZooConfigMixin:
    """Conversion to / from the attnzoo dataclass; ``_attnzoo_class`` names it (set with ``_renamed`` by the
    fields base, :func:`_fields_of`)."""

    _attnzoo_class: ClassVar[type[ModelConfig]]
    #: attnzoo field -> transformers field, where the names differ
    _renamed: ClassVar[dict[str, str]]
    #: transformers Auto class -> the attnzoo.hf class it loads (``auto_map``)
    _auto_classes: ClassVar[dict[str, str]] = {}

    def to_attnzoo(self) -> ModelConfig:
        """The attnzoo config these fields describe (validated by attnzoo)."""
        values = {}
        for name in attnzoo_fields(self._attnzoo_class):
            hf_name = self._renamed.get(name, name)
            # a field deleted from the instance (or a config built without transformers' dataclass init) takes
            # attnzoo's default
            if not hasattr(self, hf_name):
                continue
            v = getattr(self, hf_name)
            # JSON round trips turn tuples into lists and dicts stay dicts; attnzoo accepts both
            values[name] = dict(v) if isinstance(v, dict) else v
        return self._attnzoo_class(**values)

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        """``transformers``' ``save_pretrained``, plus ``auto_map`` and the module it names (:data:`LOADER_MODULE`):
        ``transformers`` can then load the directory without ``import attnzoo.hf`` when given
        ``trust_remote_code=True`` (and without it says to pass that, rather than to update transformers). The
        module only imports the installed ``attnzoo.hf``; no attnzoo code is copied."""
        from attnzoo._io import atomic_write_text

        self.auto_map = {auto: f"{LOADER_MODULE}.{name}" for auto, name in self._auto_classes.items()}
        out = super().save_pretrained(save_directory, *args, **kwargs)
        atomic_write_text(Path(save_directory) / f"{LOADER_MODULE}.py", _LOADER_SOURCE)
        return out

    @classmethod
    def from_attnzoo(cls, config: ModelConfig, **kwargs: Any):
        """The ``transformers`` config of an attnzoo config (``kwargs``: extra ``transformers`` fields)."""
        if not isinstance(config, cls._attnzoo_class):
            raise TypeError(
                f"{cls.__name__}.from_attnzoo needs a {cls._attnzoo_class.__name__}, got {type(config).__name__}"
            )
        values = {cls._renamed.get(k, k): v for k, v in dataclasses.asdict(config).items()}
        values.update(kwargs)
        return cls(**values)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any):
        """A registered attnzoo model (``attnzoo.list_models()``) as a ``transformers`` config.

        ``overrides`` are attnzoo config fields (a new ``attention`` resets its options unless
        ``attention_options`` is given too), e.g. ``from_preset("tost_gpt_base", dim=64, depth=2)``.
        """
        from attnzoo.models.registry import get_config

        extra = {k: overrides.pop(k) for k in list(overrides) if k not in attnzoo_fields(cls._attnzoo_class)}
        cfg = get_config(name, **overrides)
        if not isinstance(cfg, cls._attnzoo_class):
            raise ValueError(
                f"model {name!r} is a {type(cfg).__name__}, not a {cls._attnzoo_class.__name__}; "
                f"use the config class of its family"
            )
        return cls.from_attnzoo(cfg, **extra)

    def _validate(self) -> None:
        try:
            self.to_attnzoo()
        except (TypeError, ValueError) as e:
            raise type(e)(f"{type(self).__name__}: {e}") from None


_LM_RENAMED = {"tie_weights": "tie_word_embeddings"}
_VISION_RENAMED = {"num_classes": "num_labels"}
#: ``transformers``' names of the fields every family has -> attnzoo's (each family adds its own and its renamed ones,
#: attnzoo's name -> ``transformers``')
_COMMON_ATTRIBUTES = {"hidden_size": "dim", "num_hidden_layers": "depth", "num_attention_heads": "heads"}


def _fields_of(attnzoo_class: type[ModelConfig], renamed: dict[str, str], **defaults: Any) -> type[PretrainedConfig]:
    """A ``PretrainedConfig`` declaring the fields of ``attnzoo_class`` (under ``renamed`` names), the base of the
    family's ``transformers`` config: the attnzoo dataclass is the one list of fields, so none goes missing here
    when attnzoo gains one. ``defaults`` override attnzoo's where the family's ``transformers`` config differs.

    ``num_labels`` (attnzoo's ``num_classes``) is ``PretrainedConfig``'s property over ``id2label``: not a field.
    """
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": __name__, "__annotations__": annotations}
    namespace.update(_attnzoo_class=attnzoo_class, _renamed=renamed)  # class attributes: not fields
    for f in dataclasses.fields(attnzoo_class):
        name = renamed.get(f.name, f.name)
        if name == "num_labels":
            continue
        annotations[name] = f.type
        if name in defaults:
            namespace[name] = defaults[name]
        elif f.default_factory is not dataclasses.MISSING:
            namespace[name] = field(default_factory=f.default_factory)
        else:
            namespace[name] = f.default
    return type(f"_{attnzoo_class.__name__}Fields", (PretrainedConfig,), namespace)


class AttnZooCausalLMConfig(_AttnZooConfigMixin, _fields_of(CausalLMConfig, _LM_RENAMED, dim=768, heads=12)):
    """Config of :class:`attnzoo.hf.AttnZooForCausalLM` (fields of :class:`attnzoo.models.config.CausalLMConfig`).

    ``attention`` is any causal mechanism (``attnzoo.list_attentions(causal=True)``). ``tie_word_embeddings``
    is attnzoo's ``tie_weights`` (both names work). Input ``(B, T)`` token ids, ``T <= block_size``.
    """

    model_type: ClassVar[str] = "attnzoo_causal_lm"
    _auto_classes: ClassVar[dict[str, str]] = {
        "AutoConfig": "AttnZooCausalLMConfig",
        "AutoModelForCausalLM": "AttnZooForCausalLM",
    }
    attribute_map: ClassVar[dict[str, str]] = {
        **_COMMON_ATTRIBUTES,
        "max_position_embeddings": "block_size",
        **_LM_RENAMED,
    }
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["past_key_values"]

    # generation
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        self._validate()


class AttnZooVisionConfig(_AttnZooConfigMixin, _fields_of(VisionConfig, _VISION_RENAMED)):
    """Config of :class:`attnzoo.hf.AttnZooForImageClassification` (fields of :class:`attnzoo.models.config.
    VisionConfig`). attnzoo's ``num_classes`` is ``transformers``' ``num_labels`` (both names work; the labels
    live in ``id2label``). Input ``(B, in_chans, image_size, image_size)`` pixel values.
    """

    model_type: ClassVar[str] = "attnzoo_vision"
    _auto_classes: ClassVar[dict[str, str]] = {
        "AutoConfig": "AttnZooVisionConfig",
        "AutoModelForImageClassification": "AttnZooForImageClassification",
    }
    attribute_map: ClassVar[dict[str, str]] = {**_COMMON_ATTRIBUTES, "num_channels": "in_chans", **_VISION_RENAMED}

    def __post_init__(self, **kwargs: Any) -> None:
        # attnzoo's default head has 1000 classes (ImageNet); transformers' default is 2 labels
        if self.id2label is None and kwargs.get("num_labels") is None and kwargs.get("num_classes") is None:
            kwargs["num_labels"] = 1000
        if "num_classes" in kwargs:
            kwargs["num_labels"] = kwargs.pop("num_classes")
        super().__post_init__(**kwargs)
        self._validate()
