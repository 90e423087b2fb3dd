"""The model registry: one model class per architecture, and the papers' configurations by name.

This module imports nothing from attnzoo (timm's ``_registry.py`` pattern), so every model file can register
into it without an import cycle:

- a model file puts ``@register_architecture`` above its class; the class's ``config_class.arch`` (the tag
  written into ``config.json``) is the architecture's name, and both the model class and its config class are
  found from it (:func:`model_class_for`, :func:`config_class_for`);
- a configuration function puts ``@register_model("name", paper=...)`` above itself (``models/zoo.py``).

Registrations happen when their module is imported; ``attnzoo.models/__init__.py`` imports every public module
of the package (:func:`attnzoo.registry.import_submodules`, the convention of ``attnzoo.layers`` too), so a new
model file registers itself without being listed anywhere, and a model defined elsewhere registers when defined.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, TypeVar

__all__ = [
    "ModelEntry",
    "register_architecture",
    "unregister_architecture",
    "list_architectures",
    "model_class_for",
    "config_class_for",
    "register_model",
    "unregister_model",
    "list_models",
    "model_entry",
    "get_config",
]


class _Config(Protocol):
    """What the registry needs of a model config (``attnzoo.models.config.ModelConfig`` provides it)."""

    arch: str

    def replace(self, **overrides: Any) -> _Config: ...


ModelClass = TypeVar("ModelClass", bound=type)

#: architecture tag (``config_class.arch``) -> model class
_ARCHITECTURES: dict[str, type] = {}


def register_architecture(cls: ModelClass) -> ModelClass:
    """Class decorator: ``cls(config)`` builds every config whose ``arch`` is ``cls.config_class.arch``."""
    arch = getattr(getattr(cls, "config_class", None), "arch", None)
    if not isinstance(arch, str) or not arch:
        raise TypeError(f"{cls.__name__}.config_class must be a config class with a non-empty 'arch' tag")
    if _ARCHITECTURES.get(arch, cls) is not cls:
        raise ValueError(f"architecture {arch!r} is already registered (by {_ARCHITECTURES[arch].__name__})")
    _ARCHITECTURES[arch] = cls
    return cls


def unregister_architecture(arch: str) -> None:
    """Remove an architecture (for tests that register a temporary one)."""
    _ARCHITECTURES.pop(arch, None)


def list_architectures() -> list[str]:
    """Registered architecture tags, sorted."""
    return sorted(_ARCHITECTURES)


def model_class_for(arch: str) -> type:
    """The model class registered for ``arch``."""
    if arch not in _ARCHITECTURES:
        raise ValueError(f"unknown model arch {arch!r}; valid archs: {list_architectures()}")
    return _ARCHITECTURES[arch]


def config_class_for(arch: str) -> type:
    """The config class of the model registered for ``arch`` (what ``config.json`` is read into)."""
    return model_class_for(arch).config_class


@dataclass(frozen=True)
class ModelEntry:
    """A registered configuration: ``factory()`` returns a fresh config.

    ``paper``: the source (paper and table); ``paper_params``: the parameter count the paper reports, in
    units of ``paper_params_unit`` (``1e6``, or ``2**20`` where a paper's figure is in binary millions);
    ``count_excludes``: parameter-name prefixes the paper's figure leaves out (nanoGPT prints counts
    without the position embedding ``wpe``); ``note``: any known deviation from the figure and why.
    """

    name: str
    factory: Callable[[], _Config]
    paper: str = ""
    paper_params: float | None = None
    paper_params_unit: float = 1e6
    note: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    count_excludes: tuple[str, ...] = field(default_factory=tuple)

    def config(self) -> _Config:
        return self.factory()


_MODELS: dict[str, ModelEntry] = {}


def register_model(
    name: str | None = None,
    *,
    paper: str = "",
    paper_params: float | None = None,
    paper_params_unit: float = 1e6,
    note: str = "",
    tags: tuple[str, ...] = (),
    count_excludes: tuple[str, ...] = (),
) -> Callable[[Callable[[], _Config]], Callable[[], _Config]]:
    """Decorator registering a zero-argument function that returns a model config.

    ``@register_model("tost_s", paper="ToST Table 5", paper_params=22.6)`` above ``def f() -> VisionConfig``.
    """

    def deco(fn: Callable[[], _Config]) -> Callable[[], _Config]:
        key = name or fn.__name__
        if key in _MODELS and _MODELS[key].factory is not fn:
            raise ValueError(f"model name {key!r} is already registered")
        _MODELS[key] = ModelEntry(
            key, fn, paper, paper_params, paper_params_unit, note, tuple(tags), tuple(count_excludes)
        )
        return fn

    return deco


def unregister_model(name: str) -> None:
    """Remove a named configuration (for tests that register a temporary one)."""
    _MODELS.pop(name, None)


def list_models(pattern: str | None = None) -> list[str]:
    """Registered model names, sorted; ``pattern`` is a shell-style filter such as ``"tost_*"``."""
    names = sorted(_MODELS)
    return [n for n in names if fnmatch.fnmatch(n, pattern)] if pattern else names


def model_entry(name: str) -> ModelEntry:
    """The registration of ``name`` (unknown names raise listing similar and valid names)."""
    if not isinstance(name, str) or name not in _MODELS:
        close = [n for n in sorted(_MODELS) if isinstance(name, str) and name.split("_")[0] in n]
        hint = f" (similar: {close})" if close else ""
        raise ValueError(f"unknown model {name!r}{hint}; valid names: {sorted(_MODELS)}")
    return _MODELS[name]


def get_config(name: str, **overrides: Any) -> _Config:
    """The registered config with ``overrides`` applied (a new ``attention`` resets its options unless
    ``attention_options`` is given too, since options belong to the mechanism they were written for)."""
    cfg = model_entry(name).config()
    if (
        "attention" in overrides
        and "attention_options" not in overrides
        and overrides["attention"] != getattr(cfg, "attention", None)
    ):
        overrides["attention_options"] = {}
    if (
        "second_attention" in overrides
        and "second_attention_options" not in overrides
        and overrides["second_attention"] != getattr(cfg, "second_attention", None)
    ):
        overrides["second_attention_options"] = {}
    return cfg.replace(**overrides)
