"""Token-mixer modules ``(B, N, dim) -> (B, N, dim)``; importing this package registers them all."""
from attnzoo.layers.base import (
    Attention,
    RecurrentMixin,
    attention_info,
    build_attention,
    capture_internals,
    list_attentions,
    register_attention,
)

# Each module registers its mechanism(s) on import.
from attnzoo.layers import softmax, linear, xca, mssa, tssa, fastmax, csp, cbsa  # noqa: F401,E402

__all__ = [
    "Attention",
    "RecurrentMixin",
    "attention_info",
    "build_attention",
    "capture_internals",
    "list_attentions",
    "register_attention",
]
