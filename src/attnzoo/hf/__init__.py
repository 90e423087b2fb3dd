"""attnzoo for Hugging Face ``transformers`` (install with ``pip install "attnzoo[hf]"``).

Importing this package registers attnzoo's two model families with the Auto classes:

- ``AttnZooCausalLMConfig`` / ``AttnZooForCausalLM`` (``model_type="attnzoo_causal_lm"``,
  ``AutoModelForCausalLM``): GPT-2, ToST, AoT, Fastmax GPT with any causal mechanism;
- ``AttnZooVisionConfig`` / ``AttnZooForImageClassification`` (``model_type="attnzoo_vision"``,
  ``AutoModelForImageClassification``): ViT/DeiT, XCiT, ToST, CRATE, CBT, AoT, CSP-ViT.

Also: :func:`swap_attention` (replace the self-attention of ``transformers`` GPT-2, Llama-family and ViT
models by an attnzoo mechanism) and the checkpoint converters of :mod:`attnzoo.hf.conversion`.
This is the only part of attnzoo that imports ``transformers``.
"""

from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'attnzoo.hf needs the transformers library: pip install "attnzoo[hf]" (keep your torch pinned, '
        'e.g. pip install "torch==<your version>" "attnzoo[hf]")'
    ) from e

from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageClassification

from attnzoo.hf.configs import AttnZooCausalLMConfig, AttnZooVisionConfig
from attnzoo.hf.conversion import (
    attnzoo_to_hf,
    config_from_hf,
    config_to_hf,
    hf_to_attnzoo,
    state_dict_from_hf,
    state_dict_to_hf,
)
from attnzoo.hf.models import AttnZooForCausalLM, AttnZooForImageClassification, RecurrentCache
from attnzoo.hf.swap import SwapReport, swap_attention


def _register() -> None:
    # exist_ok: re-importing (e.g. importlib.reload in a notebook) must not fail
    AutoConfig.register(AttnZooCausalLMConfig.model_type, AttnZooCausalLMConfig, exist_ok=True)
    AutoConfig.register(AttnZooVisionConfig.model_type, AttnZooVisionConfig, exist_ok=True)
    AutoModelForCausalLM.register(AttnZooCausalLMConfig, AttnZooForCausalLM, exist_ok=True)
    AutoModelForImageClassification.register(AttnZooVisionConfig, AttnZooForImageClassification, exist_ok=True)


_register()

__all__ = [
    "AttnZooCausalLMConfig",
    "AttnZooVisionConfig",
    "AttnZooForCausalLM",
    "AttnZooForImageClassification",
    "RecurrentCache",
    "SwapReport",
    "swap_attention",
    "attnzoo_to_hf",
    "hf_to_attnzoo",
    "config_to_hf",
    "config_from_hf",
    "state_dict_to_hf",
    "state_dict_from_hf",
]
