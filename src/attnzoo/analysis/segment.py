"""Zero-shot segmentation by the [CLS] attention map (CBSA Tables 5/6, Fig. 7; ToST Fig. 5) on scenes with exact masks.

Per attention layer and head, the map of what the [CLS] token attends to over the patch grid:

- softmax / MSSA (and any layer recording a token-token ``attn`` with a [CLS] token): the [CLS] row of the map;
- CBSA: the [CLS] row of ``A_k A_kᵀ`` (``N x N``), CBSA Fig. 7's estimate of the full attention from the recorded
  extraction map ``A_kᵀ`` (``attn_extract``, ``(B, H, M, N)``);
- TSSA: its memberships ``Π`` (``pi``, ``(B, H, N)``, ToST eq 9), the only per-token map a TSSA layer has (it has
  no [CLS] query: every token is weighted by its own membership);
- class-attention layers (ToST, XCiT): the [CLS] query's map ``(B, H, 1, 1 + N)``, ToST Fig. 5's map.

A map is thresholded as DINO (Caron et al. 2021) and "Emergence of segmentation" (Yu et al. 2024) do, whose
protocol CBSA follows: keep the patches holding the top ``mass`` (60%) of the map's total (:func:`threshold_mass`),
then upsample to pixels (nearest). Against each scene's exact masks (:mod:`attnzoo.data.scenes`) the IoU (Jaccard)
is taken per target: foreground (the kept pixels vs the objects), background (the rest vs the background) and
boundary (the band of the kept region's edges vs the band of the objects' edges, both of width ``w``). CBSA
reports "the best-performing attention maps": here, per layer, the head with the best mean foreground IoU
(Table 6), and per target the best mean over layers and heads (Table 5).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnzoo._io import atomic_save_figure
from attnzoo.data.scenes import SceneDataset, boundary_band

from .capture import LayerCapture, capture_layers, token_grid
from .io import prepare_out_dir, write_json
from .plotting import PALETTE, new_figure

__all__ = [
    "TARGETS",
    "cls_attention_maps",
    "threshold_mass",
    "upsample_masks",
    "iou",
    "segmentation_ious",
    "zero_shot_segmentation",
    "plot_segment_layers",
    "plot_segment_overlays",
    "plot_scene_examples",
    "add_segment_parser",
    "load_scenes_run",
    "run_segment_cli",
]

#: the segmentation targets of CBSA Table 5
TARGETS = ("foreground", "background", "boundary")


def _layer_map(lay: LayerCapture, grid: tuple[int, int] | None) -> tuple[str, torch.Tensor] | None:
    """``(source, maps (B, H, Hg, Wg))`` of one captured layer, or ``None`` when it records no per-token map."""
    internals = lay.internals
    n = lay.input.shape[1]
    row, source = None, None
    attn = internals.get("attn")
    if lay.mechanism == "class_attention" and isinstance(attn, torch.Tensor):
        row, source = attn[:, :, 0, :], "class attention [CLS] row"  # (B, H, 1 + N)
    elif isinstance(attn, torch.Tensor) and attn.ndim == 4 and attn.shape[-1] == attn.shape[-2] == n:
        row, source = attn[:, :, 0, :], "[CLS] row of the attention"
    elif isinstance(internals.get("attn_extract"), torch.Tensor):
        ext = internals["attn_extract"]  # A_kᵀ (B, H, M, N); CBSA Fig. 7 estimates the attention as A_k A_kᵀ
        if ext.ndim == 4 and ext.shape[-1] == n:
            row, source = (ext.transpose(-1, -2) @ ext)[:, :, 0, :], "[CLS] row of A_k A_k^T (CBSA Fig. 7)"
    elif isinstance(internals.get("pi"), torch.Tensor) and internals["pi"].ndim == 3:
        row, source = internals["pi"], "TSSA memberships Pi (ToST eq 9)"
    if row is None:
        return None
    prefix, (hg, wg) = token_grid(row.shape[-1], grid)
    if lay.mechanism != "class_attention" and source.startswith("[CLS]") and prefix < 1:
        return None  # no [CLS] token takes part in this layer: its first row is a patch's
    return source, row[..., prefix:].reshape(*row.shape[:2], hg, wg).float()


def cls_attention_maps(
    model: nn.Module, images: torch.Tensor, *, grid: tuple[int, int] | None = None
) -> list[dict[str, Any]]:
    """Per attention layer (in forward order) that has a per-token map: ``{"name", "mechanism", "source", "maps"}``
    with ``maps`` ``(B, H, Hg, Wg)`` over the patch grid (see the module doc for each mechanism's map)."""
    grid = grid or _model_grid(model)
    _, layers = capture_layers(model, images)
    out = []
    for lay in layers:
        got = _layer_map(lay, grid)
        if got is not None:
            out.append({"name": lay.name, "mechanism": lay.mechanism, "source": got[0], "maps": got[1]})
    if not out:
        raise ValueError(
            f"{type(model).__name__} records no per-token [CLS] map (softmax/MSSA 'attn' with a [CLS] token, CBSA "
            "'attn_extract', TSSA 'pi' or class attention); zero-shot segmentation needs one"
        )
    return out


def _model_grid(model: nn.Module) -> tuple[int, int] | None:
    g = getattr(model, "grid", None)
    return tuple(g) if g is not None else None


def threshold_mass(maps: torch.Tensor, mass: float = 0.6) -> torch.Tensor:
    """Keep the largest entries of each map ``(..., Hg, Wg)`` holding a ``mass`` fraction of its total (DINO's rule:
    sorted ascending, an entry is kept where the cumulative share exceeds ``1 - mass``). Negative entries count 0."""
    if not 0.0 < mass <= 1.0:
        raise ValueError(f"mass={mass!r} must lie in (0, 1] (the share of each map's total to keep)")
    flat = maps.flatten(-2).clamp_min(0).double()
    val, idx = torch.sort(flat, dim=-1)
    total = val.sum(-1, keepdim=True)
    share = torch.cumsum(val, -1) / torch.where(total > 0, total, torch.ones_like(total))
    keep_sorted = share > 1.0 - mass
    keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    return keep.reshape(maps.shape)


def upsample_masks(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Nearest upsampling of boolean patch masks ``(..., Hg, Wg)`` to pixels ``(..., H, W)``."""
    lead = masks.shape[:-2]
    x = masks.reshape(-1, 1, *masks.shape[-2:]).float()
    return F.interpolate(x, size=size, mode="nearest").reshape(*lead, *size) > 0.5


def iou(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Jaccard ``|P ∩ T| / |P ∪ T|`` over the last two dims of boolean ``(..., H, W)`` masks; 1 where both are empty."""
    inter = (pred & target).flatten(-2).sum(-1).double()
    union = (pred | target).flatten(-2).sum(-1).double()
    return torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union))


def segmentation_ious(
    pred: torch.Tensor, masks: dict[str, torch.Tensor], boundary_width: int
) -> dict[str, torch.Tensor]:
    """IoU per target of pixel masks ``pred`` ``(B, K, H, W)`` (K maps per image, e.g. heads) against a scene's
    ``masks`` (``(B, H, W)`` each): foreground vs ``pred``, background vs ``~pred``, boundary vs the band of
    ``pred``'s edges of the same width. Returns ``{target: (B, K)}``."""
    fg, bg, edge = (masks[t].bool().unsqueeze(1) for t in TARGETS)
    band = torch.from_numpy(boundary_band(pred.numpy().astype(np.int8), boundary_width))
    return {"foreground": iou(pred, fg), "background": iou(~pred, bg), "boundary": iou(band, edge)}


def _per_image_ious(
    model: nn.Module, scenes: SceneDataset, images: int, batch_size: int, mass: float
) -> tuple[list[dict[str, Any]], list[dict[str, torch.Tensor]]]:
    """Per layer: its description and ``{target: (images, heads)}`` IoUs of the first ``images`` scenes."""
    param = next(model.parameters(), None)
    chunks: list[dict[str, list[torch.Tensor]]] = []
    layers: list[dict[str, Any]] = []
    for start in range(0, images, batch_size):
        idx = np.arange(start, min(images, start + batch_size))
        (x,), _ = scenes.get_batch(idx)
        if param is not None:
            x = x.to(device=param.device, dtype=param.dtype)
        masks = scenes.masks(idx)
        size = tuple(masks["foreground"].shape[-2:])
        for i, entry in enumerate(cls_attention_maps(model, x)):
            pred = upsample_masks(threshold_mass(entry["maps"].cpu(), mass), size)
            ious = segmentation_ious(pred, masks, scenes.spec.boundary_width)
            if start == 0:
                layers.append({k: entry[k] for k in ("name", "mechanism", "source")})
                chunks.append({t: [] for t in ious})
            for t, v in ious.items():
                chunks[i][t].append(v)
    return layers, [{t: torch.cat(v) for t, v in c.items()} for c in chunks]


def zero_shot_segmentation(
    model: nn.Module,
    scenes: SceneDataset,
    *,
    images: int = 64,
    batch_size: int = 32,
    mass: float = 0.6,
) -> dict[str, Any]:
    """IoU per layer, head and target of the thresholded [CLS] maps of ``model`` on the first ``images`` scenes
    (CBSA Tables 5/6): ``layers[i]["iou"][target]`` is the per-head mean over the scenes, ``"iou_sem"`` its
    standard error (std / sqrt(images)); ``"best"`` is the head of the best mean foreground IoU."""
    if not isinstance(images, int) or isinstance(images, bool) or not 1 <= images <= len(scenes):
        raise ValueError(f"images={images!r} must be an int in [1, {len(scenes)}] (the scenes available)")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    layers, per_image = _per_image_ious(model.eval(), scenes, images, batch_size, mass)
    for lay, ious in zip(layers, per_image, strict=True):
        lay["iou"] = {t: v.mean(0).tolist() for t, v in ious.items()}
        sem = {t: (v.std(0) / images**0.5) if images > 1 else torch.zeros(v.shape[1]) for t, v in ious.items()}
        lay["iou_sem"] = {t: v.tolist() for t, v in sem.items()}
        best = int(np.argmax(lay["iou"]["foreground"]))
        lay["best_head"] = best
        lay["best"] = {t: lay["iou"][t][best] for t in TARGETS}
        lay["best_sem"] = {t: lay["iou_sem"][t][best] for t in TARGETS}
    best = {t: max(max(lay["iou"][t]) for lay in layers) for t in TARGETS}
    return {
        "experiment": "segment",
        "params": {"images": images, "mass": mass, "boundary_width": scenes.spec.boundary_width},
        "layers": layers,
        "best": best,
    }


def plot_segment_layers(result: dict):
    """IoU per layer (best head by foreground IoU) for each target: CBSA Table 6 as curves."""
    fig = new_figure(6.0, 3.2)
    ax = fig.add_subplot(1, 1, 1)
    layers = result["layers"]
    xs = np.arange(1, len(layers) + 1)
    for c, t in enumerate(TARGETS):
        ax.plot(xs, [lay["best"][t] for lay in layers], "o-", color=PALETTE[c], label=t)
    ax.set_xticks(xs, [f"{i}\n{lay['mechanism']}" for i, lay in zip(xs, layers, strict=True)], fontsize=7)
    ax.set_xlabel("attention layer")
    ax.set_ylabel("IoU (best head)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title(f"zero-shot segmentation of the [CLS] maps (top {result['params']['mass']:.0%} mass)", fontsize=9)
    return fig


def plot_segment_overlays(model: nn.Module, scenes: SceneDataset, *, images: int = 4, mass: float = 0.6):
    """Scenes (rows) with each layer's best-foreground-head [CLS] map over them and its kept region outlined."""
    idx = np.arange(min(images, len(scenes)))
    (x,), _ = scenes.get_batch(idx)
    param = next(model.parameters(), None)
    if param is not None:
        x = x.to(device=param.device, dtype=param.dtype)
    found = cls_attention_maps(model.eval(), x)
    pixels = scenes.pixels(idx)
    fg = scenes.masks(idx)["foreground"]
    size = tuple(pixels.shape[-2:])
    cols = len(found) + 1
    fig = new_figure(1.3 * cols + 0.3, 1.4 * len(idx) + 0.4)
    axes = np.atleast_2d(fig.subplots(len(idx), cols, squeeze=False))
    for r in range(len(idx)):
        axes[r, 0].imshow(pixels[r], cmap="gray", vmin=0, vmax=1)
        axes[r, 0].contour(fg[r].numpy(), levels=[0.5], colors=[PALETTE[2]], linewidths=0.6)
        for c, entry in enumerate(found, start=1):
            maps = entry["maps"][r].cpu()  # (H, Hg, Wg)
            pred = upsample_masks(threshold_mass(maps, mass), size)
            head = int(iou(pred, fg[r].unsqueeze(0)).argmax())
            heat = F.interpolate(maps[head][None, None], size=size, mode="nearest")[0, 0]
            axes[r, c].imshow(pixels[r], cmap="gray", vmin=0, vmax=1)
            axes[r, c].imshow(heat.numpy(), cmap="inferno", alpha=0.6)
            axes[r, c].contour(pred[head].numpy().astype(float), levels=[0.5], colors=["cyan"], linewidths=0.6)
            if r == 0:
                axes[r, c].set_title(f"L{c} {entry['mechanism']}", fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0, 0].set_title("scene (objects: green)", fontsize=7)
    fig.suptitle(f"[CLS] maps, best head per layer; cyan: top {mass:.0%} of the mass", fontsize=8)
    return fig


# ---------------------------------------------------------------------------------------------
# attnzoo analyze segment RUN_DIR
# ---------------------------------------------------------------------------------------------
def add_segment_parser(sub) -> argparse.ArgumentParser:
    """The ``segment`` sub-command of ``attnzoo analyze``."""
    desc = "CBSA Tables 5/6, ToST Fig. 5: IoU of thresholded [CLS] maps with a scenes run's exact masks"
    p = sub.add_parser("segment", help=desc, description=desc)
    p.add_argument("run", help="run directory written by attnzoo train on the scenes task")
    p.add_argument("--out", default=None, help="output directory (default: RUN/segment; new or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace files in a non-empty --out")
    p.add_argument("--checkpoint", default="latest", help="checkpoint directory, or 'latest' (default)")
    p.add_argument("--images", type=int, default=256, help="validation scenes to score (default 256)")
    p.add_argument("--overlays", type=int, default=4, help="scenes drawn in segment_overlays.png")
    p.add_argument("--mass", type=float, default=0.6, help="share of each map's mass kept (default 0.6, DINO's)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dpi", type=int, default=110)
    return p


def load_scenes_run(run: str | os.PathLike, checkpoint: str = "latest") -> tuple[nn.Module, SceneDataset, Path]:
    """``(model in eval mode, validation scenes, checkpoint)`` of a run of ``attnzoo train`` on the scenes task."""
    from attnzoo.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
    from attnzoo.train.objectives import build_task_model
    from attnzoo.train.run_dir import load_run
    from attnzoo.train.trainer import build_run_task

    run = Path(run)
    cfg = load_run(run)
    if cfg.task != "scenes":
        raise ValueError(
            f"run {str(run)!r} trained on task {cfg.task!r}; zero-shot segmentation needs the 'scenes' "
            "task (its exact masks)"
        )
    ckpt = latest_checkpoint(run / "checkpoints") if checkpoint == "latest" else Path(checkpoint)
    if ckpt is None:
        raise CheckpointError(f"{run} has no checkpoint yet")
    task = build_run_task(cfg)
    model = build_task_model(cfg, task)
    load_checkpoint(ckpt, model, restore_rng=False)
    return model.eval(), task.val, ckpt


def run_segment_cli(args: argparse.Namespace) -> list[Path]:
    """Score a run (``segment.json``), draw the per-layer IoUs (``segment.png``) and overlays; returns the paths."""
    out = prepare_out_dir(args.out or Path(args.run) / "segment", overwrite=args.overwrite)
    model, scenes, ckpt = load_scenes_run(args.run, args.checkpoint)
    images = min(args.images, len(scenes)) if args.images >= 1 else args.images
    result = zero_shot_segmentation(model, scenes, images=images, batch_size=args.batch_size, mass=args.mass)
    result["params"].update(run=str(args.run), checkpoint=str(ckpt))
    paths = [write_json(out / "segment.json", result)]
    paths.append(atomic_save_figure(plot_segment_layers(result), out / "segment.png", dpi=args.dpi))
    overlay = plot_segment_overlays(model, scenes, images=args.overlays, mass=args.mass)
    paths.append(atomic_save_figure(overlay, out / "segment_overlays.png", dpi=args.dpi))
    for lay in result["layers"]:
        b = lay["best"]
        e = lay["best_sem"]
        print(
            f"{lay['name']:>16} {lay['mechanism']:>15}  head {lay['best_head']}: "
            + "  ".join(f"{t} {b[t]:.3f} ± {e[t]:.3f}" for t in TARGETS)
        )
    print("best over layers and heads: " + "  ".join(f"{t} {v:.3f}" for t, v in result["best"].items()))
    return paths


def plot_scene_examples(scenes: SceneDataset, *, images: int = 6):
    """Scenes (top row) over their semantic maps (middle; 0 = background) and boundary bands (bottom)."""
    idx = np.arange(min(images, len(scenes)))
    pixels, masks = scenes.pixels(idx), scenes.masks(idx)
    fig = new_figure(1.25 * len(idx), 3.9)
    axes = np.atleast_2d(fig.subplots(3, len(idx), squeeze=False))
    ncls = max(1, int(masks["semantic"].max()))
    for c, i in enumerate(idx):
        s = scenes.scene(i)
        axes[0, c].imshow(pixels[c], cmap="gray", vmin=0, vmax=1)
        axes[0, c].set_title(f"label {s.label}; {','.join(map(str, s.classes))}", fontsize=6)
        axes[1, c].imshow(masks["semantic"][c].numpy(), cmap="tab20", vmin=0, vmax=max(ncls, 10))
        axes[2, c].imshow(masks["boundary"][c].numpy(), cmap="gray")
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    for r, what in enumerate(("scene", "semantic", f"boundary (w={scenes.spec.boundary_width})")):
        axes[r, 0].set_ylabel(what, fontsize=7)
    return fig
