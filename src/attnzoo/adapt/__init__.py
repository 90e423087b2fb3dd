"""Adapting pretrained models into attnzoo's mechanisms (CBSA §4 / Fig. 9; Hedgehog and LoLCATs' attention transfer).

:func:`adapt` swaps a pretrained model's attention for a mechanism (reusing its projections), trains the new
attention to reproduce the original layer by layer, then fine-tunes; :func:`load_gguf_llama` reads a GGUF
Llama-family model (SmolLM2) into ``transformers``. Needs the ``hf`` extra (``transformers``); LoRA needs ``peft``
(the ``adapt`` extra).
"""

from __future__ import annotations

from attnzoo.adapt.gguf import load_gguf_llama, load_smollm2
from attnzoo.adapt.loop import (
    AdaptConfig,
    AdaptError,
    AdaptResult,
    adapt,
    load_student,
    plot_transfer,
    transfer_losses,
)
from attnzoo.adapt.student import FAMILIES, AdaptLayer, Student, make_student, model_family

__all__ = [
    "AdaptConfig",
    "AdaptError",
    "AdaptLayer",
    "AdaptResult",
    "FAMILIES",
    "load_gguf_llama",
    "load_smollm2",
    "load_student",
    "Student",
    "adapt",
    "make_student",
    "model_family",
    "plot_transfer",
    "transfer_losses",
]
