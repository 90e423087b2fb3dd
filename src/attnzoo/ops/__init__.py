"""Pure attention operators on already-projected tensors, layout ``(B, H, N, P)``.

One sub-package per mechanism, each with a ``naive.py`` reference and its fast path(s), exporting one
public function. The imports below are eager on purpose: importing ``attnzoo.ops.tssa`` binds the
*sub-package* to ``attnzoo.ops.tssa``, and the function imported afterwards must be what that name means.
"""

from __future__ import annotations

from attnzoo.ops.cbsa import cbsa
from attnzoo.ops.csp import csp, csp_permutations, csp_shifts, csp_source_index
from attnzoo.ops.ema import ema
from attnzoo.ops.fastmax import fastmax
from attnzoo.ops.linear import linear_attention
from attnzoo.ops.mega import mega_attention
from attnzoo.ops.mssa import mssa
from attnzoo.ops.softmax import softmax_attention
from attnzoo.ops.tssa import tssa
from attnzoo.ops.xca import xca

__all__ = [
    "cbsa",
    "csp",
    "csp_permutations",
    "csp_shifts",
    "csp_source_index",
    "ema",
    "fastmax",
    "linear_attention",
    "mega_attention",
    "mssa",
    "softmax_attention",
    "tssa",
    "xca",
]
