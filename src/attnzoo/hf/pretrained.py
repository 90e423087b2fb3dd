"""Pretrained language models read from local files, with their tokenizers (used by ``attnzoo adapt``).

GGUF files (llama.cpp's format) are read by ``transformers`` (``from_pretrained(..., gguf_file=)``, with the
``gguf`` package): it dequantises the weights to float and undoes llama.cpp's row permutation of the query and key
projections (llama.cpp interleaves each head's two rotary halves; ``transformers`` rotates the first half against
the second). Nothing is downloaded: only local files are read.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

__all__ = ["load_gguf_causal_lm", "load_local_causal_lm"]


def _check_vocab(model, tokenizer, what: str) -> None:
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(
            f"{what}: its tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} rows; the "
            f"tokenizer does not belong to this model"
        )


def load_gguf_causal_lm(path: Path, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` from the GGUF file ``path`` (an existing file; weights dequantised to ``dtype``)."""
    try:
        import gguf  # noqa: F401 - transformers reads GGUF through it
    except ImportError as e:
        raise ImportError('reading GGUF files needs the gguf package: pip install "attnzoo[adapt]"') from e
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    _check_vocab(model, tokenizer, str(path))
    return model.eval(), tokenizer


def load_local_causal_lm(path: Path):
    """``(model, tokenizer)`` from a local ``transformers`` model directory (``config.json``, weights, tokenizer)."""
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a transformers model directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"{path}: no tokenizer files ({e})") from None
    _check_vocab(model, tokenizer, str(path))
    return model.eval(), tokenizer
