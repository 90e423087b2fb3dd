"""Model registry API (timm-style): build the papers' named configurations with ``create_model``.

The registrations themselves live in :mod:`attnzoo.models._registry` (which imports nothing from attnzoo);
this module adds what needs torch: building a model from a config, and parameter counts on the meta device.
"""

from __future__ import annotations

import torch
from torch import nn

from attnzoo.models._registry import (
    ModelEntry,
    config_class_for,
    get_config,
    list_architectures,
    list_models,
    model_class_for,
    model_entry,
    register_architecture,
    register_model,
    unregister_architecture,
    unregister_model,
)
from attnzoo.models.config import ModelConfig

__all__ = [
    "ModelEntry",
    "register_model",
    "unregister_model",
    "register_architecture",
    "unregister_architecture",
    "list_architectures",
    "create_model",
    "list_models",
    "model_entry",
    "get_config",
    "count_parameters",
    "paper_comparable_count",
    "model_class_for",
    "config_class_for",
    "build_model",
]


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


def build_model(
    cfg: ModelConfig, *, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> nn.Module:
    """Instantiate the model class registered for ``cfg.arch``."""
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
    cfg = (
        get_config(name_or_config, **overrides)
        if isinstance(name_or_config, str)
        else (name_or_config.replace(**overrides) if overrides else name_or_config)
    )
    model = build_model(cfg, device="meta")
    return sum(p.numel() for n, p in model.named_parameters() if not any(n.startswith(e) for e in exclude))


def paper_comparable_count(name: str) -> int:
    """The registered model's parameter count under the paper's own counting convention."""
    return count_parameters(name, exclude=model_entry(name).count_excludes)
