"""Segmentation decoders on scenes (CBSA Fig. 8): build, fit, mIoU, decoder FLOPs, and the robustness sweep that adds
Gaussian noise of std ``sigma`` to every parameter of the decoder's attention layers (Fig. 8, middle and right)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import attnzoo
from attnzoo.data.scenes import SceneDataset
from attnzoo.layers.base import Attention
from attnzoo.models.segmenter import MaskDecoder, SegmentationModel

__all__ = [
    "build_segmenter",
    "confusion_matrix",
    "mean_iou",
    "fit_segmenter",
    "evaluate_miou",
    "decoder_flops",
    "perturb_attention",
    "perturbation_sweep",
]


def build_segmenter(
    encoder: str,
    decoder: str,
    *,
    num_classes: int,
    image_size: int,
    in_chans: int = 1,
    decoder_depth: int = 2,
    decoder_options: dict | None = None,
    **encoder_options: Any,
) -> SegmentationModel:
    """A registered vision model ``encoder`` (sized by ``encoder_options``) under a ``decoder`` ("cbsa" or
    "mask_transformer") predicting ``num_classes`` classes (background included) per pixel."""
    enc = attnzoo.create_model(encoder, image_size=image_size, in_chans=in_chans, num_classes=0, **encoder_options)
    cfg = enc.config
    dec = MaskDecoder(
        cfg.dim,
        num_classes,
        tuple(cfg.grid),
        kind=decoder,
        depth=decoder_depth,
        heads=cfg.heads,
        attention_options=decoder_options,
    )
    return SegmentationModel(enc, dec)


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(K, K)`` counts, rows = target class, columns = predicted class, of integer maps of one shape."""
    if pred.shape != target.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} must have one shape")
    idx = target.reshape(-1).long() * num_classes + pred.reshape(-1).long()
    return torch.bincount(idx, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def mean_iou(confusion: torch.Tensor) -> float:
    """Mean over the classes that occur (in the target or the prediction) of ``TP / (TP + FP + FN)``."""
    conf = confusion.double()
    tp = conf.diagonal()
    union = conf.sum(0) + conf.sum(1) - tp
    present = union > 0
    return float((tp[present] / union[present]).mean()) if present.any() else 1.0


def _batches(scenes: SceneDataset, images: int, batch_size: int):
    for start in range(0, images, batch_size):
        idx = np.arange(start, min(images, start + batch_size))
        (x,), _ = scenes.get_batch(idx)
        yield x, scenes.masks(idx)["semantic"]


def fit_segmenter(
    model: SegmentationModel,
    scenes: SceneDataset,
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Per-pixel cross-entropy on the scenes' semantic maps with AdamW; returns the training losses."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive int")
    gen = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    losses = []
    for _ in range(steps):
        idx = gen.integers(0, len(scenes), batch_size)
        (x,), _ = scenes.get_batch(idx)
        target = scenes.masks(idx)["semantic"]
        loss = F.cross_entropy(model(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@torch.no_grad()
def evaluate_miou(model: nn.Module, scenes: SceneDataset, *, images: int = 256, batch_size: int = 64) -> float:
    """mIoU of ``model``'s per-pixel argmax on the first ``images`` scenes (classes + background)."""
    if not 1 <= images <= len(scenes):
        raise ValueError(f"images={images!r} must lie in [1, {len(scenes)}]")
    model.eval()
    conf = None
    for x, target in _batches(scenes, images, batch_size):
        logits = model(x)
        c = confusion_matrix(logits.argmax(1), target, logits.shape[1])
        conf = c if conf is None else conf + c
    return mean_iou(conf)


def decoder_flops(model: SegmentationModel, image_size: int, in_chans: int = 1) -> int:
    """Floating-point operations of one image's pass through the decoder (``torch.utils.flop_counter``)."""
    with torch.no_grad():
        tokens = model.encoder.forward_tokens(torch.zeros(1, in_chans, image_size, image_size))
        patches = tokens[:, model.encoder.num_prefix_tokens :]
        counter = FlopCounterMode(display=False)
        with counter:
            model.decoder(patches)
    return int(counter.get_total_flops())


def perturb_attention(model: SegmentationModel, sigma: float, generator: torch.Generator) -> SegmentationModel:
    """A copy of ``model`` with ``N(0, sigma^2)`` noise added to every parameter of the decoder's attention layers."""
    if not sigma >= 0:
        raise ValueError(f"sigma={sigma!r} must be >= 0")
    noisy = copy.deepcopy(model)
    with torch.no_grad():
        for mod in noisy.decoder.modules():
            if isinstance(mod, Attention):
                for p in mod.parameters():
                    p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * sigma)
    return noisy


def perturbation_sweep(
    model: SegmentationModel,
    scenes: SceneDataset,
    sigmas: list[float],
    *,
    draws: int = 3,
    images: int = 128,
    seed: int = 0,
) -> dict[str, Any]:
    """mIoU per ``sigma`` over ``draws`` noise draws (CBSA Fig. 8, middle and right): ``{"sigmas", "miou"}`` with
    ``miou[i]`` the list of the draws' mIoUs at ``sigmas[i]``."""
    if not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws={draws!r} must be a positive int")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for sigma in sigmas:
        out.append([evaluate_miou(perturb_attention(model, sigma, gen), scenes, images=images) for _ in range(draws)])
    return {"sigmas": list(sigmas), "draws": draws, "miou": out}
