"""In-context learning of linear functions (AoT §4.1.2, following Garg et al. 2022).

A prompt draws ``w`` (dense ``N(0, I_d)``, or with only ``sparsity`` non-zero Gaussian coordinates)
and ``x_1..x_n ~ N(0, I_d)``; the targets are ``y_i = w^T x_i``. The model sees
``(x_1, y_1, ..., x_n)`` and predicts every ``y_i`` from the prefix ending at ``x_i``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["icl_sample", "least_squares_baseline"]


def icl_sample(rng: np.random.Generator, dim: int = 20, n_points: int = 41, sparsity: int | None = None):
    """``((xs (n, d) float32, ys (n,) float32), ys)`` for one random linear function."""
    w = rng.standard_normal(dim)
    if sparsity is not None:
        if not 1 <= sparsity <= dim:
            raise ValueError(f"sparsity must be in [1, dim={dim}], got {sparsity}")
        keep = rng.choice(dim, size=sparsity, replace=False)
        mask = np.zeros(dim, bool)
        mask[keep] = True
        w = np.where(mask, w, 0.0)
    xs = rng.standard_normal((n_points, dim))
    ys = xs @ w
    xs, ys = xs.astype(np.float32), ys.astype(np.float32)
    return (xs, ys), ys


def least_squares_baseline(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Squared error per position ``(n,)`` of min-norm least squares fitted on the preceding examples.

    ``xs (B, n, d)``, ``ys (B, n)``; position ``i`` uses examples ``0..i-1`` (zero prediction at ``i = 0``).
    """
    b, n, _ = xs.shape
    err = np.zeros((b, n))
    for i in range(n):
        for j in range(b):
            if i == 0:
                pred = 0.0
            else:
                w, *_ = np.linalg.lstsq(xs[j, :i].astype(np.float64), ys[j, :i].astype(np.float64), rcond=None)
                pred = xs[j, i] @ w
            err[j, i] = (pred - ys[j, i]) ** 2
    return err.mean(0)
