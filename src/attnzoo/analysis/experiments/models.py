"""Experiments on (trained) models, through :func:`attnzoo.analysis.capture_layers`:
``layerwise`` (ToST Fig. 4a, CBSA Fig. 5), ``membership`` (ToST Fig. 4b/9), ``attention-maps``
(ToST Fig. 5, FAST Fig. 4) and ``subspaces`` (ToST Fig. 11).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnzoo._checks import check_positive_int

from .. import measures
from ..capture import LayerCapture, capture_layers, layer_measures, memberships, subspace_bases, token_grid
from ..plotting import PALETTE, grid_shape, new_figure

__all__ = [
    "load_model",
    "example_input",
    "layerwise",
    "plot_layerwise",
    "membership",
    "plot_membership",
    "attention_maps",
    "plot_attention_maps",
    "subspaces",
    "plot_subspaces",
]


# ---------------------------------------------------------------------------------------------
# models and inputs
# ---------------------------------------------------------------------------------------------
def load_model(
    *, checkpoint: str | os.PathLike | None = None, model: str | None = None, options: Mapping | None = None
) -> nn.Module:
    """A model in eval mode: ``attnzoo.from_pretrained(checkpoint)`` or ``attnzoo.create_model(model, **options)``."""
    if (checkpoint is None) == (model is None):
        raise ValueError("give exactly one of checkpoint (a from_pretrained directory) or model (a registered name)")
    import attnzoo

    if checkpoint is not None:
        if not Path(checkpoint).is_dir():
            raise ValueError(f"checkpoint {str(checkpoint)!r} is not a directory written by save_pretrained")
        m = attnzoo.from_pretrained(checkpoint)
    else:
        m = attnzoo.create_model(model, **dict(options or {}))
    return m.eval()


def _config(model: nn.Module):
    cfg = getattr(model, "config", None)
    if cfg is None and hasattr(model, "model"):  # wrappers returned by from_pretrained
        cfg = getattr(model.model, "config", None)
    return cfg


def example_input(
    model: nn.Module, *, batch: int = 2, data: str | os.PathLike | None = None, seed: int = 0
) -> torch.Tensor:
    """A batch for ``model``: loaded from ``data`` (a ``.pt`` tensor or ``.npy`` array holding a ready
    batch, e.g. images ``(B, C, H, W)``), else random inputs of the shape the model's config asks for
    (Gaussian images for vision models, uniform token ids for sequence models).
    """
    check_positive_int("batch", batch)
    if data is not None:
        path = Path(data)
        if not path.is_file():
            raise ValueError(f"data {str(path)!r} is not a file; give a .pt or .npy batch")
        if path.suffix == ".npy":
            x = torch.from_numpy(np.load(path, allow_pickle=False))
        elif path.suffix == ".pt":
            x = torch.load(path, weights_only=True)
        else:
            raise ValueError(f"data {str(path)!r} must end in .pt or .npy")
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"data {str(path)!r} must hold one tensor, got {type(x).__name__}")
        return x[:batch].float() if x.is_floating_point() else x[:batch]
    cfg = _config(model)
    gen = torch.Generator().manual_seed(seed)
    if cfg is not None and hasattr(cfg, "image_size"):
        return torch.randn(batch, cfg.in_chans, cfg.image_size, cfg.image_size, generator=gen)
    if cfg is not None and hasattr(cfg, "vocab_size"):
        n = min(64, getattr(cfg, "block_size", getattr(cfg, "max_len", 64)))
        return torch.randint(0, cfg.vocab_size, (batch, n), generator=gen)
    raise ValueError(
        f"cannot guess an input for {type(model).__name__} (no vision/sequence config); pass data=<batch .pt/.npy>"
    )


def _grid_of(model: nn.Module) -> tuple[int, int] | None:
    cfg = _config(model)
    g = getattr(cfg, "grid", None)
    return tuple(g) if g is not None else None


def _self_layers(layers: list[LayerCapture]) -> list[LayerCapture]:
    return [lay for lay in layers if lay.mechanism != "class_attention"]


# ---------------------------------------------------------------------------------------------
# layerwise: ToST Fig. 4a, CBSA Fig. 5
# ---------------------------------------------------------------------------------------------
def layerwise(model: nn.Module, inputs, *, eps: float = 0.5, crate_eps: float = 0.1) -> dict:
    """Per attention layer ``ℓ``: coding rate, compression term ``R_c(Z^ℓ | U^ℓ)`` (CBSA eq 2) and,
    for TSSA, ``R^var_c(Z^ℓ, Π^ℓ | U^ℓ)`` (ToST eq 4), raw and on unit-norm tokens (at ``eps``), and the
    compression term as CRATE's code measures it (unit-norm codes per head, ``ε = crate_eps``; entering
    the layer and leaving its block), where ``Z^ℓ`` is the token mixer's input and ``U^ℓ``, ``Π^ℓ`` the
    layer's own bases and memberships.
    """
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    _, layers = capture_layers(model, *args)
    rows = []
    for lay in _self_layers(layers):
        rows.append({"name": lay.name, "mechanism": lay.mechanism, **layer_measures(lay, eps, crate_eps=crate_eps)})
    keys = sorted({k for r in rows for k in r if k not in ("name", "mechanism")})
    series = {k: [r.get(k, float("nan")) for r in rows] for k in keys}
    return {"experiment": "layerwise", "params": {"eps": eps, "crate_eps": crate_eps}, "layers": rows, "series": series}


def plot_layerwise(result: dict):
    groups = [
        ("CRATE's measure (unit-norm codes)", ["crate_compression", "crate_compression_out"]),
        ("compression term", ["compression", "variational_compression", "variational_compression_out"]),
        ("normalised tokens", ["compression_normalized", "variational_compression_normalized"]),
        ("coding rate R(Z)", ["coding_rate", "coding_rate_normalized"]),
    ]
    groups = [(t, [k for k in ks if k in result["series"]]) for t, ks in groups]
    groups = [(t, ks) for t, ks in groups if ks]
    fig = new_figure(4.2 * len(groups), 3.6)
    axes = np.atleast_1d(fig.subplots(1, len(groups)))
    x = np.arange(1, len(result["layers"]) + 1)
    for ax, (title, keys) in zip(axes, groups, strict=True):
        for i, k in enumerate(keys):
            ax.plot(x, result["series"][k], "o-", ms=3, color=PALETTE[i], label=k)
        ax.set_xticks(x)
        ax.set_xlabel("layer")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    mechs = sorted({r["mechanism"] for r in result["layers"]})
    crate = result["params"].get("crate_eps")
    fig.suptitle(
        f"layer-wise compression ({', '.join(mechs)}; ε={result['params']['eps']}"
        + (f", CRATE's ε²={crate**2:.3g}" if crate is not None else "")
        + ")",
        fontsize=10,
    )
    return fig


# ---------------------------------------------------------------------------------------------
# membership: ToST Fig. 4b / 9
# ---------------------------------------------------------------------------------------------
def _pick(items: list, which: Sequence[int] | None, default_count: int) -> list:
    if which is not None:
        bad = [i for i in which if not -len(items) <= i < len(items)]
        if bad:
            raise ValueError(f"layer index/indices {bad} out of range: the model has {len(items)} such layers")
        return [items[i] for i in which]
    if len(items) <= default_count:
        return items
    idx = np.unique(np.linspace(0, len(items) - 1, default_count).round().astype(int))
    return [items[i] for i in idx]


def membership(
    model: nn.Module,
    inputs,
    *,
    layers: Sequence[int] | None = None,
    image: int = 0,
    grid: tuple[int, int] | None = None,
) -> dict:
    """TSSA memberships ``Π^ℓ`` of one input: per layer and head, the column ``π_k`` reshaped onto the
    token grid (ToST Fig. 4b/9). ``layers`` indexes the TSSA layers (default: up to 4 evenly spaced).
    """
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    _, caps = capture_layers(model, *args)
    with_pi = [lay for lay in caps if memberships(lay) is not None]
    if not with_pi:
        raise ValueError("no layer recorded memberships 'pi' (TSSA); membership needs a model with TSSA layers")
    grid = grid or _grid_of(model)
    out = {}
    for lay in _pick(with_pi, layers, 4):
        pi = memberships(lay)  # (B, N, K)
        if not 0 <= image < pi.shape[0]:
            raise ValueError(f"image={image} out of range for a batch of {pi.shape[0]}")
        prefix, (hg, wg) = token_grid(pi.shape[1], grid)
        maps = pi[image, prefix:].T.reshape(pi.shape[-1], hg, wg)  # (K, Hg, Wg)
        out[lay.name] = maps.tolist()
    return {
        "experiment": "membership",
        "params": {"image": image, "layers": list(layers) if layers else None},
        "membership": out,
    }


def plot_membership(result: dict):
    maps = result["membership"]
    heads = max(len(v) for v in maps.values())
    fig = new_figure(1.6 * heads + 0.8, 1.7 * len(maps) + 0.4)
    axes = np.atleast_2d(fig.subplots(len(maps), heads, squeeze=False))
    for r, (name, per_head) in enumerate(maps.items()):
        for h in range(heads):
            ax = axes[r, h]
            ax.set_xticks([])
            ax.set_yticks([])
            if h < len(per_head):
                ax.imshow(np.asarray(per_head[h]), vmin=0, vmax=1, cmap="viridis")
            if r == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(name, fontsize=7)
    fig.suptitle("TSSA memberships Π (rows = layers, columns = subspaces/heads; ToST Fig. 4b)", fontsize=9)
    return fig


# ---------------------------------------------------------------------------------------------
# attention-maps: ToST Fig. 5 ([CLS] maps) and FAST Fig. 4 (attention matrices side by side)
# ---------------------------------------------------------------------------------------------
def _attention_matrix(lay: LayerCapture) -> torch.Tensor | None:
    """``(B, H, N, N)`` token-token attention of a self-attention layer, if it recorded one."""
    n = lay.input.shape[1]
    a = lay.internals.get("attn")
    # token x token only: XCA records a channel x channel (P x P) map under the same name
    if isinstance(a, torch.Tensor) and a.ndim == 4 and a.shape[-1] == a.shape[-2] == n:
        return a
    ext = lay.internals.get("attn_extract")  # CBSA: A_kᵀ (B, H, M, N); CBSA Fig. 7 estimates A_k A_kᵀ
    if isinstance(ext, torch.Tensor) and ext.ndim == 4 and ext.shape[-1] == n:
        return ext.transpose(-1, -2) @ ext
    return None


def attention_maps(
    models: Mapping[str, nn.Module],
    inputs,
    *,
    layer: int | None = None,
    image: int = 0,
    grid: tuple[int, int] | None = None,
) -> dict:
    """Per model: the [CLS] attention map of every head of the penultimate class-attention layer (or
    the CLS row of the chosen self-attention layer) on the token grid (ToST Fig. 5), and every head's
    token-token attention matrix of self-attention layer ``layer`` (default: the last one; FAST Fig. 4).
    ``inputs`` is one batch for all models or a mapping model label -> batch.
    """
    if not models:
        raise ValueError("attention_maps needs at least one model")
    cls_maps, matrices, chosen = {}, {}, {}
    for label, model in models.items():
        x = inputs[label] if isinstance(inputs, Mapping) else inputs
        args = x if isinstance(x, tuple) else (x,)
        _, caps = capture_layers(model, *args)
        g = grid or _grid_of(model)
        with_matrix = [(lay, _attention_matrix(lay)) for lay in _self_layers(caps)]
        with_matrix = [(lay, a) for lay, a in with_matrix if a is not None]
        class_layers = [lay for lay in caps if lay.mechanism == "class_attention" and "attn" in lay.internals]
        entry = {}
        if with_matrix:
            lay, a = _pick(with_matrix, [layer if layer is not None else -1], 1)[0]
            if not 0 <= image < a.shape[0]:
                raise ValueError(f"image={image} out of range for a batch of {a.shape[0]}")
            matrices[label] = a[image].tolist()
            entry["matrix_layer"] = lay.name
        cls_row = None
        if class_layers:
            lay = class_layers[-2] if len(class_layers) >= 2 else class_layers[-1]  # penultimate (ToST Fig. 5)
            cls_row = lay.internals["attn"][image, :, 0, :]  # (H, 1+N): the CLS query over [CLS, patches]
            entry["cls_layer"] = lay.name
        elif with_matrix:
            try:
                prefix, _ = token_grid(with_matrix[-1][1].shape[-1], g)
            except ValueError:
                prefix = 0
            if prefix >= 1:  # a [CLS] token takes part in self-attention: use its row
                lay, a = _pick(with_matrix, [layer if layer is not None else -1], 1)[0]
                cls_row = a[image, :, 0, :]
                entry["cls_layer"] = lay.name
        if cls_row is not None:
            try:
                prefix, (hg, wg) = token_grid(cls_row.shape[-1], g)
                cls_maps[label] = cls_row[:, prefix:].reshape(-1, hg, wg).tolist()
            except ValueError:
                pass
        chosen[label] = entry
    if not cls_maps and not matrices:
        raise ValueError(
            "no model recorded attention maps ('attn' of softmax/mssa/fastmax, CBSA 'attn_extract' "
            "or class-attention layers); nothing to draw"
        )
    return {
        "experiment": "attention-maps",
        "params": {"layer": layer, "image": image},
        "layers": chosen,
        "cls_maps": cls_maps,
        "matrices": matrices,
    }


def plot_attention_maps(result: dict):
    rows = [("cls", k) for k in result["cls_maps"]] + [("matrix", k) for k in result["matrices"]]
    heads = max(len(result["cls_maps" if kind == "cls" else "matrices"][k]) for kind, k in rows)
    fig = new_figure(1.7 * heads + 1.0, 1.9 * len(rows) + 0.4)
    axes = np.atleast_2d(fig.subplots(len(rows), heads, squeeze=False))
    for r, (kind, label) in enumerate(rows):
        maps = result["cls_maps"][label] if kind == "cls" else result["matrices"][label]
        lay = result["layers"][label].get("cls_layer" if kind == "cls" else "matrix_layer", "")
        for h in range(heads):
            ax = axes[r, h]
            ax.set_xticks([])
            ax.set_yticks([])
            if h < len(maps):
                ax.imshow(np.asarray(maps[h]), cmap="inferno")
            if r == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                what = "[CLS] map" if kind == "cls" else "attention"
                ax.set_ylabel(f"{label}\n{what}\n{lay}", fontsize=6)
    fig.suptitle("[CLS] attention maps (ToST Fig. 5) and attention matrices (FAST Fig. 4)", fontsize=9)
    return fig


# ---------------------------------------------------------------------------------------------
# subspaces: ToST Fig. 11
# ---------------------------------------------------------------------------------------------
def subspaces(model: nn.Module, *, directions: int | None = 4, seed: int = 0) -> dict:
    """Gram matrices ``[U_1…U_K]ᵀ[U_1…U_K]`` of the column-normalised learned bases of every white-box
    layer (TSSA/MSSA/CBSA), keeping ``directions`` random columns per subspace (ToST Fig. 11), and each
    layer's mean/max absolute cross-subspace cosine (0 = orthogonal subspaces, the papers' assumption).
    """
    from attnzoo.layers.base import Attention

    gen = torch.Generator().manual_seed(seed)
    grams, coherence = {}, {}
    for name, mod in model.named_modules():
        if not isinstance(mod, Attention):
            continue
        u = subspace_bases(mod)
        if u is None:
            continue
        k, _, p = u.shape
        d = None if directions is None else min(directions, p)
        grams[name] = measures.subspace_gram(u, directions=d, generator=gen).tolist()
        full = measures.subspace_gram(u).abs()
        mask = ~torch.block_diag(*[torch.ones(p, p, dtype=torch.bool)] * k)
        cross = full[mask]
        coherence[name] = {
            "mean_abs_cross": float(cross.mean()) if cross.numel() else 0.0,
            "max_abs_cross": float(cross.max()) if cross.numel() else 0.0,
        }
    if not grams:
        raise ValueError("the model has no white-box layers with subspace bases (tssa, mssa, cbsa); nothing to draw")
    return {
        "experiment": "subspaces",
        "params": {"directions": directions, "seed": seed},
        "gram": grams,
        "coherence": coherence,
    }


def plot_subspaces(result: dict):
    names = list(result["gram"])
    rows, cols = grid_shape(len(names), 4)
    fig = new_figure(2.8 * cols, 2.8 * rows)
    axes = np.atleast_2d(fig.subplots(rows, cols, squeeze=False))
    im = None
    for i, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if i >= len(names):
            ax.axis("off")
            continue
        g = np.asarray(result["gram"][names[i]])
        im = ax.imshow(g, vmin=-1, vmax=1, cmap="RdBu_r")
        c = result["coherence"][names[i]]
        ax.set_title(f"{names[i]}\nmean|cross|={c['mean_abs_cross']:.2f}", fontsize=7)
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8)
    fig.suptitle("Gram of normalised subspace bases [U_1…U_K]ᵀ[U_1…U_K] (ToST Fig. 11)", fontsize=9)
    return fig
