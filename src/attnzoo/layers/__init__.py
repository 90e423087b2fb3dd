"""Token-mixer modules ``(B, N, dim) -> (B, N, dim)``; importing this package registers them all.

Every module of this package is imported here, so a new mechanism's layer file registers itself without being
listed anywhere (see docs/adding_a_mechanism.md).
"""

import importlib
import pkgutil

from attnzoo.layers.base import (
    Attention,
    RecurrentMixin,
    attention_info,
    build_attention,
    capture_internals,
    list_attentions,
    register_attention,
)

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _m.startswith("_"):
        importlib.import_module(f"{__name__}.{_m}")  # each layer module registers its mechanism on import
del _m

__all__ = [
    "Attention",
    "RecurrentMixin",
    "attention_info",
    "build_attention",
    "capture_internals",
    "list_attentions",
    "register_attention",
]
