"""Model registry (timm-style): named configurations from the papers, built with ``create_model``."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from attnzoo.models.config import ModelConfig

__all__ = [
    "ModelEntry",
    "register_model",
    "create_model",
    "list_models",
    "model_entry",
    "get_config",
    "count_parameters",
    "paper_comparable_count",
    "model_class_for",
    "build_model",
]


@dataclass(frozen=True)
class ModelEntry:
    """A registered configuration: ``factory()`` returns a fresh config.

    ``paper``: the source (paper and table); ``paper_params``: the parameter count the paper reports, in
    units of ``paper_params_unit`` (``1e6``, or ``2**20`` where a paper's figure is in binary millions);
    ``count_excludes``: parameter-name prefixes the paper's figure leaves out (nanoGPT prints counts
    without the position embedding ``wpe``); ``note``: any known deviation from the figure and why.
    """

    name: str
    factory: Callable[[], ModelConfig]
    paper: str = ""
    paper_params: float | None = None
    paper_params_unit: float = 1e6
    note: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    count_excludes: tuple[str, ...] = field(default_factory=tuple)

    def config(self) -> ModelConfig:
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
):
    """Decorator registering a zero-argument function that returns a model config.

    ``@register_model("tost_s", paper="ToST Table 5", paper_params=22.6)`` above ``def f() -> VisionConfig``.
    """

    def deco(fn: Callable[[], ModelConfig]) -> Callable[[], ModelConfig]:
        key = name or fn.__name__
        if key in _MODELS and _MODELS[key].factory is not fn:
            raise ValueError(f"model name {key!r} is already registered")
        _MODELS[key] = ModelEntry(
            key, fn, paper, paper_params, paper_params_unit, note, tuple(tags), tuple(count_excludes)
        )
        return fn

    return deco


def _ensure_loaded() -> None:
    import attnzoo.models.zoo  # noqa: F401  (registers the built-in configurations)


def list_models(pattern: str | None = None) -> list[str]:
    """Registered model names, sorted; ``pattern`` is a shell-style filter such as ``"tost_*"``."""
    _ensure_loaded()
    names = sorted(_MODELS)
    return [n for n in names if fnmatch.fnmatch(n, pattern)] if pattern else names


def model_entry(name: str) -> ModelEntry:
    _ensure_loaded()
    if not isinstance(name, str) or name not in _MODELS:
        close = [n for n in sorted(_MODELS) if isinstance(name, str) and name.split("_")[0] in n]
        hint = f" (similar: {close})" if close else ""
        raise ValueError(f"unknown model {name!r}{hint}; valid names: {sorted(_MODELS)}")
    return _MODELS[name]


def get_config(name: str, **overrides) -> ModelConfig:
    """The registered config with ``overrides`` applied (a new ``attention`` resets its options unless
    ``attention_options`` is given too, since options belong to the mechanism they were written for)."""
    cfg = model_entry(name).config()
    if "attention" in overrides and "attention_options" not in overrides and overrides["attention"] != cfg.attention:
        overrides["attention_options"] = {}
    if (
        "second_attention" in overrides
        and "second_attention_options" not in overrides
        and overrides["second_attention"] != getattr(cfg, "second_attention", None)
    ):
        overrides["second_attention_options"] = {}
    return cfg.replace(**overrides)


def model_class_for(arch: str) -> type[nn.Module]:
    from attnzoo.models.icl import ICLRegressor
    from attnzoo.models.language import CausalLM
    from attnzoo.models.sequence import SequenceClassifier
    from attnzoo.models.vision import VisionTransformer

    classes = {c.config_class.arch: c for c in (VisionTransformer, CausalLM, SequenceClassifier, ICLRegressor)}
    if arch not in classes:
        raise ValueError(f"unknown model arch {arch!r}; valid archs: {sorted(classes)}")
    return classes[arch]


def create_model(
    name: str,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    **overrides,
) -> nn.Module:
    """Build a registered model, e.g. ``create_model("tost_s", attention="xca", num_classes=10)``.

    ``overrides`` are config fields (unknown ones raise listing the valid keys). ``attention=`` swaps
    the mechanism of every block (of the first part, for hybrids: add ``second_attention=None`` to use one
    mechanism throughout); causal decoders accept only mechanisms with a causal mode. ``device="meta"``
    builds the module without allocating memory (for parameter counts of large configs).
    """
    cfg = get_config(name, **overrides)
    return build_model(cfg, device=device, dtype=dtype)


def build_model(cfg: ModelConfig, *, device=None, dtype=None) -> nn.Module:
    """Instantiate the model class for a config."""
    cls = model_class_for(cfg.arch)
    if device is not None:
        with torch.device(device):
            model = cls(cfg)
    else:
        model = cls(cfg)
    if dtype is not None:
        model = model.to(dtype)
    return model


def count_parameters(name_or_config: str | ModelConfig, *, exclude: tuple[str, ...] = (), **overrides) -> int:
    """Number of parameters (tied weights counted once), computed on the meta device: no allocation.

    ``exclude``: parameter-name prefixes left out of the count (e.g. ``("wpe.",)``).
    """
    cfg = get_config(name_or_config, **overrides) if isinstance(name_or_config, str) else (
        name_or_config.replace(**overrides) if overrides else name_or_config
    )
    model = build_model(cfg, device="meta")
    return sum(p.numel() for n, p in model.named_parameters() if not any(n.startswith(e) for e in exclude))


def paper_comparable_count(name: str) -> int:
    """The registered model's parameter count under the paper's own counting convention."""
    return count_parameters(name, exclude=model_entry(name).count_excludes)
