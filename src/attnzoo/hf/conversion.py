"""Checkpoints both ways between attnzoo and ``transformers``.

Layouts: an attnzoo checkpoint is ``config.json`` (attnzoo's dataclass with its ``arch`` tag) +
``model.safetensors`` with attnzoo's parameter names (``wte.weight``, ``blocks.0.attn.qkv.weight``, ...).
The ``transformers`` checkpoint of :class:`~attnzoo.hf.AttnZooForCausalLM` /
:class:`~attnzoo.hf.AttnZooForImageClassification` is ``config.json`` (``model_type`` ``attnzoo_causal_lm`` /
``attnzoo_vision``, the same fields) + ``model.safetensors`` with the same tensors under ``model.`` and
without the tied ``lm_head.weight`` (``transformers`` stores a tied weight once and re-ties on load).
Conversions copy tensors unchanged, so they are bit-exact both ways.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnzoo.hf.configs import AttnZooCausalLMConfig, AttnZooVisionConfig
from attnzoo.models.config import CausalLMConfig, ModelConfig, VisionConfig

__all__ = [
    "PREFIX",
    "config_to_hf",
    "config_from_hf",
    "state_dict_to_hf",
    "state_dict_from_hf",
    "attnzoo_to_hf",
    "hf_to_attnzoo",
]

#: attribute of the transformers model that holds the attnzoo model (its ``base_model_prefix``)
PREFIX = "model."

_HF_CONFIGS = {CausalLMConfig: AttnZooCausalLMConfig, VisionConfig: AttnZooVisionConfig}


def config_to_hf(config: ModelConfig, **kwargs: Any):
    """The ``transformers`` config of an attnzoo ``CausalLMConfig`` / ``VisionConfig``.

    ``kwargs`` are extra ``transformers`` fields (``eos_token_id``, ``id2label``, ...).
    """
    cls = _HF_CONFIGS.get(type(config))
    if cls is None:
        raise ValueError(
            f"only causal LMs and vision classifiers have transformers models; got a {type(config).__name__} "
            f"(valid: {[c.__name__ for c in _HF_CONFIGS]})"
        )
    return cls.from_attnzoo(config, **kwargs)


def config_from_hf(config) -> ModelConfig:
    """The attnzoo config of an ``AttnZooCausalLMConfig`` / ``AttnZooVisionConfig``."""
    if not isinstance(config, tuple(_HF_CONFIGS.values())):
        raise TypeError(f"config must be an AttnZooCausalLMConfig or AttnZooVisionConfig, got {type(config).__name__}")
    return config.to_attnzoo()


def state_dict_to_hf(state_dict: dict[str, torch.Tensor], *, tied: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """attnzoo parameter names -> ``transformers`` names (``model.`` prefix); ``tied`` names are dropped."""
    out = {}
    for k, v in state_dict.items():
        if k.startswith(PREFIX.rstrip(".") + "."):
            # an attnzoo key never starts with "model." (no submodule is named so); catch double conversion
            raise ValueError(f"key {k!r} already has the transformers prefix {PREFIX!r}")
        if k not in tied:
            out[PREFIX + k] = v
    return out


def state_dict_from_hf(
    state_dict: dict[str, torch.Tensor], *, tied: dict[str, str] | None = None
) -> dict[str, torch.Tensor]:
    """``transformers`` names -> attnzoo names; ``tied`` maps a missing attnzoo key to the key it shares
    (``{"lm_head.weight": "wte.weight"}`` for tied embeddings)."""
    out = {}
    for k, v in state_dict.items():
        if not k.startswith(PREFIX):
            raise ValueError(f"key {k!r} is not an attnzoo transformers key (they start with {PREFIX!r})")
        out[k[len(PREFIX) :]] = v
    for missing, source in (tied or {}).items():
        if missing not in out and source in out:
            out[missing] = out[source]
    return out


def _tied_keys(config: ModelConfig) -> dict[str, str]:
    return {"lm_head.weight": "wte.weight"} if isinstance(config, CausalLMConfig) and config.tie_weights else {}


def attnzoo_to_hf(
    model_or_dir: nn.Module | str | os.PathLike,
    save_directory: str | os.PathLike | None = None,
    **config_kwargs: Any,
):
    """An attnzoo model (or checkpoint directory) as a ``transformers`` model with the same weights.

    With ``save_directory`` the result is also written there with ``save_pretrained`` (safetensors), ready for
    ``AutoModelForCausalLM`` / ``AutoModelForImageClassification.from_pretrained`` after ``import attnzoo.hf``.
    ``config_kwargs``: extra ``transformers`` config fields (``eos_token_id``, ``id2label``, ...).
    """
    from attnzoo.hf.models import AttnZooForCausalLM, AttnZooForImageClassification
    from attnzoo.models.checkpoint import from_pretrained

    src = from_pretrained(model_or_dir) if isinstance(model_or_dir, (str, os.PathLike)) else model_or_dir
    config = getattr(src, "config", None)
    if not isinstance(config, ModelConfig):
        raise TypeError(f"expected an attnzoo model or checkpoint directory, got {type(model_or_dir).__name__}")
    hf_config = config_to_hf(config, **config_kwargs)
    cls = AttnZooForCausalLM if isinstance(config, CausalLMConfig) else AttnZooForImageClassification
    ref = next(src.parameters())
    with torch.device("meta"):
        hf_model = cls(hf_config)
    state = state_dict_to_hf(src.state_dict(), tied=tuple(_tied_keys(config)))
    # assign=True adopts copies of the source tensors (dtype and device included) into the meta-built model
    missing, unexpected = hf_model.load_state_dict(
        {k: v.detach().clone() for k, v in state.items()}, strict=False, assign=True
    )
    missing = [k for k in missing if k[len(PREFIX) :] not in _tied_keys(config)]
    if missing or unexpected:
        raise ValueError(f"weights do not match the transformers model: missing {missing}, unexpected {unexpected}")
    if _tied_keys(config):
        hf_model.model.lm_head.weight = hf_model.model.wte.weight
    hf_model.to(ref.device)
    hf_model.train(src.training)
    if save_directory is not None:
        hf_model.save_pretrained(save_directory)
    return hf_model


def hf_to_attnzoo(
    model_or_dir: nn.Module | str | os.PathLike,
    save_directory: str | os.PathLike | None = None,
) -> nn.Module:
    """A ``transformers`` attnzoo model (or its checkpoint directory) as a plain attnzoo model.

    With ``save_directory`` the result is also written there with attnzoo's atomic ``save_pretrained``, ready
    for ``attnzoo.from_pretrained`` (no ``transformers`` needed to load it).
    """
    from attnzoo.hf.models import AttnZooPreTrainedModel
    from attnzoo.models import build_model

    if isinstance(model_or_dir, (str, os.PathLike)):
        from transformers import AutoConfig

        directory = Path(model_or_dir)
        hf_config = AutoConfig.from_pretrained(directory)
        state = _read_safetensors(directory)
    elif isinstance(model_or_dir, AttnZooPreTrainedModel):
        hf_config = model_or_dir.config
        state = {k: v.detach() for k, v in model_or_dir.state_dict().items()}
    else:
        raise TypeError(
            f"expected an AttnZooForCausalLM / AttnZooForImageClassification or its directory, got "
            f"{type(model_or_dir).__name__}"
        )
    config = config_from_hf(hf_config)
    state = state_dict_from_hf(state, tied=_tied_keys(config))
    with torch.device("meta"):
        model = build_model(config)
    model.load_state_dict({k: v.clone() for k, v in state.items()}, strict=True, assign=True)
    if _tied_keys(config):
        model.lm_head.weight = model.wte.weight
    if isinstance(model_or_dir, nn.Module):
        model.train(model_or_dir.training)
    else:
        model.eval()
    if save_directory is not None:
        model.save_pretrained(save_directory)
    return model


def _read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``transformers`` checkpoint directory (single or sharded safetensors)."""
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors weights (only safetensors checkpoints are read)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
