"""Matplotlib figures on the Agg canvas (no pyplot global state, no display needed)."""

from __future__ import annotations

import math

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["new_figure", "grid_shape", "PALETTE"]

#: colour cycle shared by the experiment plots (colour-blind friendly "tab10")
PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]


def new_figure(width: float, height: float) -> Figure:
    """A figure attached to an Agg canvas."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def grid_shape(count: int, max_cols: int = 6) -> tuple[int, int]:
    """Rows/cols for ``count`` small panels."""
    cols = max(1, min(max_cols, count))
    return math.ceil(count / cols), cols
