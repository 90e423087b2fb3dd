"""Layer-wise capture: run a model once and collect, per attention layer, its input/output token
representations (PyTorch forward hooks) and the mechanism's internals (through
:func:`attnzoo.capture_internals`, i.e. what each module ``record``-s: TSSA ``pi``, attention maps,
CBSA ``attn_extract`` ...). Model code is never patched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from einops import rearrange
from torch import nn

from attnzoo.layers.base import Attention, capture_internals

from . import measures

__all__ = [
    "LayerCapture",
    "capture_layers",
    "subspace_bases",
    "memberships",
    "token_grid",
    "layer_measures",
]


@dataclass
class LayerCapture:
    """What one attention layer saw and did in one forward pass (tensors detached, on CPU)."""

    name: str  #: qualified module name inside the model, e.g. ``"blocks.3.attn"``
    index: int  #: order of the layer's first call in the forward pass
    mechanism: str  #: registry name of the module (``"tssa"``, ``"softmax"`` ...)
    module: Attention
    input: torch.Tensor  #: ``(B, N, dim)`` tokens entering the token mixer (after any pre-norm)
    output: torch.Tensor  #: ``(B, N, dim)`` the token mixer's output (before any residual)
    block_output: torch.Tensor | None = None  #: output of the enclosing block (the residual stream), if a tensor
    internals: dict[str, torch.Tensor] = field(default_factory=dict)


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def capture_layers(model: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, list[LayerCapture]]:
    """Run ``model(*args, **kwargs)`` without gradients and return ``(model_output, layers)``.

    ``layers`` lists every :class:`~attnzoo.Attention` module that ran, in execution order, with its
    input/output tokens, the output of its parent block and its recorded internals. Class-attention
    layers (:class:`~attnzoo.models.class_attention.ClassAttention`) are included as mechanism
    ``"class_attention"`` with their CLS-query map ``attn`` ``(B, H, 1, 1+N)``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    attn_mods = [(n, m) for n, m in model.named_modules() if _is_token_mixer(m)]
    if not attn_mods:
        raise ValueError(f"{type(model).__name__} holds no attnzoo Attention modules; nothing to capture")
    modules = dict(model.named_modules())
    seen: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    handles = []

    def attn_hook(name: str):
        def hook(_mod, h_args, h_kwargs, output):
            if name not in seen:
                order.append(name)
            x = _first_tensor(h_args, h_kwargs)
            seen.setdefault(name, {})
            seen[name]["input"] = x.detach().cpu() if x is not None else None
            seen[name]["output"] = output.detach().cpu() if isinstance(output, torch.Tensor) else None

        return hook

    def block_hook(name: str):
        def hook(_mod, _args, output):
            if isinstance(output, torch.Tensor):
                seen.setdefault(name, {})["block_output"] = output.detach().cpu()

        return hook

    try:
        for name, mod in attn_mods:
            handles.append(mod.register_forward_hook(attn_hook(name), with_kwargs=True))
            parent = name.rpartition(".")[0]
            container = isinstance(modules.get(parent), (nn.ModuleList, nn.ModuleDict))
            if name and parent and parent in modules and not container:
                handles.append(modules[parent].register_forward_hook(block_hook(name)))
        with torch.no_grad(), capture_internals(model) as store:
            out = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    layers = []
    mods = dict(attn_mods)
    for i, name in enumerate(order):
        rec = seen[name]
        if rec.get("input") is None or rec.get("output") is None:
            continue
        m = mods[name]
        layers.append(
            LayerCapture(
                name=name,
                index=i,
                mechanism=_mechanism(m),
                module=m,
                input=rec["input"],
                output=rec["output"],
                block_output=rec.get("block_output"),
                internals={k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in store.get(name, {}).items()},
            )
        )
    return out, layers


def _is_token_mixer(m: nn.Module) -> bool:
    return isinstance(m, Attention)


def _mechanism(m: Attention) -> str:
    from attnzoo.models.class_attention import ClassAttention

    if isinstance(m, ClassAttention):  # not a registered mixer (its output is the CLS token only)
        return "class_attention"
    return getattr(type(m), "registry_name", None) or type(m).__name__


def subspace_bases(module: nn.Module) -> torch.Tensor | None:
    """The subspace bases ``U: (K, dim, p)`` of a white-box mechanism, or ``None`` for black-box ones.

    Uses ``module.subspace_bases()`` when defined; otherwise the ``dim -> dim`` projection the mechanism declares
    shared as query, key and value (``Mechanism.projections.shared``: TSSA's and MSSA's ``qkv``, CBSA's ``proj``),
    whose weight rows for head ``k`` are ``U_kᵀ``.
    """
    fn = getattr(module, "subspace_bases", None)
    if callable(fn):
        return fn()
    spec = getattr(type(module), "mechanism", None)
    attr = spec.projections.shared if spec is not None and spec.projections is not None else None
    lin = getattr(module, attr, None) if attr else None
    dim, heads = getattr(module, "dim", None), getattr(module, "heads", None)
    if isinstance(lin, nn.Linear) and dim is not None and tuple(lin.weight.shape) == (dim, dim):
        return rearrange(lin.weight.detach().cpu(), "(k p) d -> k d p", k=heads)
    return None


def memberships(layer: LayerCapture) -> torch.Tensor | None:
    """TSSA's membership matrix ``Π: (B, N, K)`` from the recorded ``pi`` ``(B, H, N)``, else ``None``."""
    pi = layer.internals.get("pi")
    if not isinstance(pi, torch.Tensor) or pi.ndim != 3:
        return None
    return pi.transpose(-1, -2)


def token_grid(n: int, grid: tuple[int, int] | None = None) -> tuple[int, tuple[int, int]]:
    """``(prefix, (Hg, Wg))`` laying ``n`` tokens on an image grid: ``n = prefix + Hg·Wg``.

    Without ``grid``: a square grid, after dropping one leading [CLS] token if that makes ``n`` square.
    """
    if grid is not None:
        hg, wg = int(grid[0]), int(grid[1])
        if hg < 1 or wg < 1 or hg * wg > n:
            raise ValueError(f"grid={tuple(grid)} does not fit {n} tokens; need Hg*Wg <= {n}")
        return n - hg * wg, (hg, wg)
    for prefix in (0, 1):
        s = math.isqrt(n - prefix) if n - prefix > 0 else 0
        if s > 0 and s * s == n - prefix:
            return prefix, (s, s)
    raise ValueError(
        f"cannot lay {n} tokens on a square image grid (neither {n} nor {n - 1} is a square); pass grid=(Hg, Wg)"
    )


def layer_measures(layer: LayerCapture, eps: float = 0.5, *, crate_eps: float = 0.1) -> dict[str, float]:
    """Per-layer white-box measures on the layer's input tokens ``Z^ℓ`` (batch mean).

    Always ``coding_rate`` (``R(Z)``, CBSA eq 1) and its normalised variant; with subspace bases
    ``U^ℓ`` also the compression term ``R_c(Z | U)`` (CBSA eq 2, raw and normalised, at ``eps``) and
    CRATE's measured compression term (:func:`~attnzoo.analysis.measures.crate_compression_term`:
    unit-norm codes per head, ``ε = crate_eps``, CRATE's code uses ``ε² = 0.01``) of the tokens entering
    the layer (``crate_compression``) and of those leaving its block (``crate_compression_out``, the
    block's output, where the block's output is a tensor), both with the layer's own ``U^ℓ``; with TSSA's
    recorded memberships ``Π^ℓ`` also ToST's variational compression ``R^var_c(Z, Π | U)`` (eq 4), and the same of
    the tokens leaving the block with the memberships the layer assigns to them (``variational_compression_out``,
    ToST Fig. 4a's "outputs Z^ℓ and Π^ℓ = Π(Z^ℓ | U^ℓ)").
    """
    z = layer.input.to(torch.float64)
    out = {
        "coding_rate": float(measures.coding_rate(z, eps).mean()),
        "coding_rate_normalized": float(measures.coding_rate(measures.normalize_tokens(z), eps).mean()),
    }
    u = subspace_bases(layer.module)
    if u is not None and u.shape[1] == z.shape[-1]:
        out["compression"] = float(measures.compression_term(z, u, eps).mean())
        out["compression_normalized"] = float(measures.compression_term(z, u, eps, normalize=True).mean())
        out["crate_compression"] = float(measures.crate_compression_term(z, u, crate_eps).mean())
        zo = layer.block_output  # the tokens leaving the layer's block (None where the block returns no tensor)
        if isinstance(zo, torch.Tensor) and zo.ndim == z.ndim and zo.shape[-1] == z.shape[-1]:
            out["crate_compression_out"] = float(
                measures.crate_compression_term(zo.to(torch.float64), u, crate_eps).mean()
            )
        pi = memberships(layer)
        if pi is not None and pi.shape[-2] == z.shape[-2] and pi.shape[-1] == u.shape[0]:
            out["variational_compression"] = float(measures.variational_compression(z, pi, u, eps).mean())
            out["variational_compression_normalized"] = float(
                measures.variational_compression(z, pi, u, eps, normalize=True).mean()
            )
            # ToST Fig. 4a measures the layer's outputs with the memberships Π(Z^ℓ | U^ℓ) of those outputs
            if isinstance(zo, torch.Tensor) and zo.ndim == z.ndim and zo.shape[-1] == z.shape[-1]:
                pi_out = _memberships_of(layer.module, zo)
                if pi_out is not None and pi_out.shape[-1] == u.shape[0]:
                    out["variational_compression_out"] = float(
                        measures.variational_compression(zo.to(torch.float64), pi_out, u, eps).mean()
                    )
    return out


def _memberships_of(module: nn.Module, tokens: torch.Tensor) -> torch.Tensor | None:
    """The memberships ``Π: (B, N, K)`` a TSSA ``module`` assigns to ``tokens`` ``(B, N, dim)``: one more forward
    of the module alone in capture mode (the model's own forward pass is not repeated)."""
    try:
        param = next(module.parameters())
        tokens = tokens.to(device=param.device, dtype=param.dtype)
    except StopIteration:
        pass
    with torch.no_grad(), capture_internals(module) as store:
        module(tokens)
    pi = store.get("", {}).get("pi")
    return pi.transpose(-1, -2).cpu() if isinstance(pi, torch.Tensor) and pi.ndim == 3 else None
