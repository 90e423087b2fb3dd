"""White-box probes: measure what the papers claim each layer does, and draw it.

- measures (:mod:`attnzoo.analysis.measures`): coding rate ``R`` and compression ``R_c`` (MCR², CBSA eq
  1-2; ToST eq 1), ToST's variational ``R^var_c`` (eq 4), subspace SNR (AoT eq 6), the rank-collapse
  residual ``‖ε(X)‖_{1,∞}`` (CSP eq 6), singular spectra and subspace Gram matrices;
- synthetic data (:mod:`attnzoo.analysis.synthetic`): AoT Definition 1, CBSA Fig. 4's noisy lines;
- parameter-free iterations (:mod:`attnzoo.analysis.iterations`): AoT eq 3, CBSA eq 12, explicit
  softmax/CSP layers for stacks without skip connections;
- capture (:mod:`attnzoo.analysis.capture`): per-layer tokens + internals of any model;
- experiments (``attnzoo analyze <experiment> --out DIR``): denoise, compress, rank-collapse,
  layerwise, membership, attention-maps, subspaces.
"""

from __future__ import annotations

from .capture import LayerCapture, capture_layers, layer_measures, memberships, subspace_bases, token_grid
from .experiments import (
    EXPERIMENTS,
    attention_maps,
    compress,
    denoise,
    layerwise,
    membership,
    rank_collapse,
    save_experiment,
    subspaces,
)
from .iterations import aot_denoise, aot_denoise_step, cbsa_linear_step, csp_reference, softmax_attention_reference
from .measures import (
    coding_rate,
    compression_term,
    norm_1_inf,
    normalize_tokens,
    partition_compression,
    rank1_residual,
    rank_collapse_residual,
    singular_spectrum,
    subspace_gram,
    subspace_snr,
    variational_compression,
)
from .synthetic import noisy_lines, orthonormal_bases, subspace_mixture

__all__ = [
    "EXPERIMENTS",
    "LayerCapture",
    "aot_denoise",
    "aot_denoise_step",
    "attention_maps",
    "capture_layers",
    "cbsa_linear_step",
    "coding_rate",
    "compress",
    "compression_term",
    "csp_reference",
    "denoise",
    "layer_measures",
    "layerwise",
    "membership",
    "memberships",
    "noisy_lines",
    "norm_1_inf",
    "normalize_tokens",
    "orthonormal_bases",
    "partition_compression",
    "rank1_residual",
    "rank_collapse",
    "rank_collapse_residual",
    "save_experiment",
    "singular_spectrum",
    "softmax_attention_reference",
    "subspace_bases",
    "subspace_gram",
    "subspace_mixture",
    "subspace_snr",
    "subspaces",
    "token_grid",
    "variational_compression",
]
