"""attnzoo: efficient and white-box attention mechanisms beside softmax, made real, fast and usable.

Top-level API (lazily imported):

- ``build_attention(name, dim, heads, *, causal=False, **options)`` / ``list_attentions()`` /
  ``attention_info(name)`` (the module class; its docstring lists the options)
- ``capture_internals(model)``: collect mechanism internals (TSSA Pi, attention maps, ...)
- ``create_model(name, **overrides)`` / ``list_models()`` / ``from_pretrained(dir)`` / ``get_config(name)`` /
  ``count_parameters(name)``
- ``swap_attention(model, mechanism, **options)``: put an attnzoo mechanism in every self-attention of a
  ``transformers`` GPT-2 / Llama / ViT model (needs the ``hf`` extra; see ``attnzoo.hf``)
- ``attnzoo.ops``: pure operators on ``(B, H, N, P)`` tensors
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "build_attention": "attnzoo.layers",
    "list_attentions": "attnzoo.layers",
    "capture_internals": "attnzoo.layers",
    "attention_info": "attnzoo.layers",
    "Attention": "attnzoo.layers",
    "create_model": "attnzoo.models",
    "list_models": "attnzoo.models",
    "from_pretrained": "attnzoo.models",
    "get_config": "attnzoo.models",
    "count_parameters": "attnzoo.models",
    # imports transformers, so only on first use: `import attnzoo` stays free of it
    "swap_attention": "attnzoo.hf",
}

__all__ = sorted(_EXPORTS) + ["ops", "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in ("ops", "layers", "models", "analysis", "data", "train", "bench"):
        return importlib.import_module(f"attnzoo.{name}")
    raise AttributeError(f"module 'attnzoo' has no attribute {name!r}")
