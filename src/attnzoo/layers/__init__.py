"""Token-mixer modules ``(B, N, dim) -> (B, N, dim)``; importing this package registers them all.

Every public module of this package is imported here (:func:`attnzoo.registry.import_submodules`, the convention
``attnzoo.models`` follows too), so a new mechanism's layer file registers itself without being listed anywhere
(see docs/adding_a_mechanism.md); a layer defined elsewhere registers with ``register_attention`` when it is
defined.
"""

from attnzoo.layers.base import Attention, RecurrentMixin, capture_internals
from attnzoo.registry import (
    attention_info,
    build_attention,
    import_submodules,
    list_attentions,
    register_attention,
    unregister_attention,
)

import_submodules(__name__, __path__)

__all__ = [
    "Attention",
    "RecurrentMixin",
    "attention_info",
    "build_attention",
    "capture_internals",
    "list_attentions",
    "register_attention",
    "unregister_attention",
]
