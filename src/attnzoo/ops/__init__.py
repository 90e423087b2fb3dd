"""Pure attention operators on already-projected tensors, layout ``(B, H, N, P)``.

One sub-package per mechanism, each with a ``naive.py`` reference and its fast path(s), exporting one
public function. Imports are lazy so that ``import attnzoo.ops`` stays cheap.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "tssa": "attnzoo.ops.tssa",
    "mssa": "attnzoo.ops.mssa",
    "fastmax": "attnzoo.ops.fastmax",
    "csp": "attnzoo.ops.csp",
    "csp_shifts": "attnzoo.ops.csp",
    "csp_permutations": "attnzoo.ops.csp",
    "csp_source_index": "attnzoo.ops.csp",
    "cbsa": "attnzoo.ops.cbsa",
    "softmax_attention": "attnzoo.ops.softmax",
    "linear_attention": "attnzoo.ops.linear",
    "xca": "attnzoo.ops.xca",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        obj = getattr(importlib.import_module(_EXPORTS[name]), name)
        # Importing the sub-package binds its *module* under the same name; the function must win.
        globals()[name] = obj
        return obj
    raise AttributeError(f"module 'attnzoo.ops' has no attribute {name!r}; available: {__all__}")


def __dir__():
    return __all__
