"""The ``attnzoo analyze`` experiments: compute functions returning JSON-ready dicts, plot functions
returning Agg figures, and :func:`save_experiment` writing ``<out>/<name>.png`` + ``<out>/<name>.json``.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnzoo._io import atomic_save_figure

from ..io import prepare_out_dir, write_json
from .models import (
    attention_maps,
    example_input,
    layerwise,
    load_model,
    membership,
    plot_attention_maps,
    plot_layerwise,
    plot_membership,
    plot_subspaces,
    subspaces,
)
from .parameter_free import compress, denoise, plot_compress, plot_denoise, plot_rank_collapse, rank_collapse

__all__ = [
    "EXPERIMENTS",
    "PLOTTERS",
    "save_experiment",
    "denoise",
    "compress",
    "rank_collapse",
    "layerwise",
    "membership",
    "attention_maps",
    "subspaces",
    "plot_denoise",
    "plot_compress",
    "plot_rank_collapse",
    "plot_layerwise",
    "plot_membership",
    "plot_attention_maps",
    "plot_subspaces",
    "load_model",
    "example_input",
]

#: experiment name -> one-line description
EXPERIMENTS: dict[str, str] = {
    "denoise": "AoT Fig. 4: SNR per layer of eq 3 (soft-max and Theorem 1's thresholded φ) on Definition 1 data",
    "compress": "CBSA Fig. 4: parameter-free eq 12 iterations compress noisy lines in R^3; coding rate falls",
    "rank-collapse": "CSP Thm 1 / Dong et al.: residual vs depth of attention stacks without skip connections",
    "layerwise": "ToST Fig. 4a / CBSA Fig. 5: compression term per layer of a model on a batch",
    "membership": "ToST Fig. 4b/9: TSSA memberships Π on the image grid, per head",
    "attention-maps": "ToST Fig. 5 / FAST Fig. 4: [CLS] maps per head and attention matrices side by side",
    "subspaces": "ToST Fig. 11: Gram matrix of normalised learned U_k across heads",
}

#: experiment name -> plot function
PLOTTERS = {
    "denoise": plot_denoise,
    "compress": plot_compress,
    "rank-collapse": plot_rank_collapse,
    "layerwise": plot_layerwise,
    "membership": plot_membership,
    "attention-maps": plot_attention_maps,
    "subspaces": plot_subspaces,
}


def save_experiment(
    result: dict, out: str | os.PathLike, *, overwrite: bool = False, dpi: int = 110
) -> dict[str, Path]:
    """Plot ``result`` and write ``<out>/<experiment>.png`` and ``.json`` atomically.

    Refuses a non-empty ``out`` unless ``overwrite``. Returns ``{"png": path, "json": path}``.
    """
    name = result.get("experiment")
    if name not in PLOTTERS:
        raise ValueError(f"result['experiment']={name!r} is not an experiment; valid: {sorted(PLOTTERS)}")
    out_dir = prepare_out_dir(out, overwrite=overwrite)
    fig = PLOTTERS[name](result)
    png = atomic_save_figure(fig, out_dir / f"{name}.png", dpi=dpi)
    js = write_json(out_dir / f"{name}.json", result)
    return {"png": png, "json": js}
