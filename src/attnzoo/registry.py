"""The attention registry, and the one registration convention of attnzoo's registries.

This module imports nothing from attnzoo (like :mod:`attnzoo.models._registry`, timm's pattern), so every layer
module can register into it without an import cycle, and a mechanism defined anywhere (a test, a user's package)
can register at runtime.

The convention, the same for token mixers and models:

- a class registers itself with a decorator above it: ``@register_attention("name")`` for a token mixer,
  ``@register_architecture`` (and ``@register_model("name")`` for a named configuration) for a model;
- its package's ``__init__`` imports every public module of the package (:func:`import_submodules`), so a new
  file in ``attnzoo/layers/`` or ``attnzoo/models/`` registers itself without being listed anywhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Iterable, Protocol, TypeVar

__all__ = [
    "register_attention",
    "unregister_attention",
    "list_attentions",
    "attention_info",
    "build_attention",
    "import_submodules",
]


class _Mixer(Protocol):
    """What the registry reads of a token-mixer class (``attnzoo.layers.base.Attention`` provides it)."""

    registry_name: str
    supports_causal: bool
    supports_noncausal: bool

    def __init__(self, dim: int, heads: int, *, causal: bool = False, **options: Any) -> None: ...


MixerClass = TypeVar("MixerClass", bound=type)

#: mechanism name -> its ``Attention`` subclass
_ATTENTIONS: dict[str, Any] = {}


def register_attention(name: str) -> Callable[[MixerClass], MixerClass]:
    """Class decorator: register an ``Attention`` subclass under ``name`` (at import, or at runtime)."""

    def deco(cls: MixerClass) -> MixerClass:
        if _ATTENTIONS.get(name, cls) is not cls:
            raise ValueError(f"attention name {name!r} is already registered to {_ATTENTIONS[name].__name__}")
        cls.registry_name = name
        _ATTENTIONS[name] = cls
        return cls

    return deco


def unregister_attention(name: str) -> None:
    """Remove a mechanism (for tests that register a temporary one)."""
    _ATTENTIONS.pop(name, None)


def list_attentions(causal: bool | None = None) -> list[str]:
    """Registered mechanism names; ``causal=True`` keeps those with a causal mode (read from their specs),
    ``causal=False`` those with a bidirectional one."""
    names = sorted(_ATTENTIONS)
    if causal is True:
        names = [n for n in names if _ATTENTIONS[n].supports_causal]
    elif causal is False:
        names = [n for n in names if _ATTENTIONS[n].supports_noncausal]
    return names


def attention_info(name: str) -> type[_Mixer]:
    """The registered class of ``name`` (its ``mechanism`` attribute is the spec, its constructor the options)."""
    if not isinstance(name, str) or name not in _ATTENTIONS:
        raise ValueError(f"unknown attention {name!r}; valid names: {sorted(_ATTENTIONS)}")
    return _ATTENTIONS[name]


def build_attention(name: str, dim: int, heads: int, *, causal: bool = False, **options: Any) -> Any:
    """Build a registered token mixer ``(B, N, dim) -> (B, N, dim)``.

    Options are checked by the mechanism's options dataclass when the module is built: an unknown one raises
    ``TypeError`` listing the valid ones, a bad value ``ValueError`` naming the option, the value and what is valid.
    """
    return attention_info(name)(dim, heads, causal=causal, **options)


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every public module of a package (its ``__name__`` and ``__path__``): each registers what it defines.

    Private modules (``_name``) are left out: they define nothing to register.
    """
    for name in sorted(m.name for m in pkgutil.iter_modules(path)):
        if not name.startswith("_"):
            importlib.import_module(f"{package}.{name}")
